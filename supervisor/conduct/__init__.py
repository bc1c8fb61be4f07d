"""The conductor and what it runs: the agent (``agent.py``), one class on every node, and its
role (``role.py``): the leader's (``leader.py``) or node K's (``node.py``, a node agent of a
multi-node job, which ``fleet.py`` starts); the state the leader shares with the stop sequence
(``state.py``), the stop sequence (``stopping.py``), signal routing, the watches, the signal
dispositions, the guard every part runs under (``guard.py``), and the GPU faults that make this
node suspect (``health.py``).

Decisions are not made here: ``supervisor.policy`` holds them as pure functions
(docs/design.md). The ports it uses its parts through are ``supervisor.ports``, below both
the conductor and the plan. Nothing is imported here."""
