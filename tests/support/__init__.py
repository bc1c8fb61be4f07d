"""Helpers the tests import (not fixtures): one home for what several test packages share."""
