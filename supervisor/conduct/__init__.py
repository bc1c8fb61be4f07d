"""The conductor and what it runs: the agent (``agent.py``), the state it shares with the stop
sequence (``state.py``), the stop sequence (``stopping.py``), signal routing, the watches, the
ports it uses its parts through, the signal dispositions, the guard every part runs under, the
node agents of a multi-node job (``fleet.py`` starts them; ``node_agent.py`` is one), and the GPU
faults that make this node suspect (``health.py``).

Decisions are not made here: ``supervisor.policy`` holds them as pure functions
(docs/design.md). Nothing is imported here, so ``supervisor.conduct.ports`` costs nothing."""
