"""The suite's library: what tests import (conftest.py files hold only pytest's fixtures and hooks).

paths       the checkout and the child programs (tests/helpers)
supervise   the real ``supervise`` as a subprocess, in a clean environment
wait        the one way to wait: ``wait_for``, ``wait_for_async``
journal     a run's events; runs: questions asked of one supervised run
emit        an in-memory Emit; webhook: a receiver for the notifier
checkpoints checkpoint files as producers write them, and what is wrong with a destination
two_nodes   a leader and a node agent on this machine
cluster     what the many-node test clusters share; slurm, pbs: the clusters themselves
contract    the journal contract of a whole run; staleness: a journal's checkpoint staleness
horovod, ddp_example, wheel: Horovod's build, examples/ddp_train.py under a launcher, the wheel
"""
