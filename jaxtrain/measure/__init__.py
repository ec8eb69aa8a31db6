"""What a run costs and how fast it goes: the estimate before it starts (`estimate`: memory per
device against what the machine has, the devices' FLOP/s peak), what is measured as it trains
(`speed`: tokens/s, MFU, ETA; `memory`: peak memory, a warning when it runs low), what a run says
of itself at its end (`summary`), and what a time budget can train here (`size_rule`:
`model.size=auto`'s choice; `speed_probe`: the machine's speed it reads). What this machine is,
and what was measured on it, live in system/ (`machine`, `measured`).

May import: system, config, core, data.
"""
