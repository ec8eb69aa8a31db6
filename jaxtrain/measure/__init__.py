"""What a run costs and how fast it goes: the estimate before it starts (`estimate`: memory per
device against what the machine has, and the devices' FLOP/s peak), what is measured as it
trains (`speed`: tokens/s, MFU, ETA, and the first reading's line; `memory`: peak memory, the
container's limit, and a warning when it runs low), what a run says of itself at its end
(`summary`: its best val loss, the tokens seen, where the time went), and what a time budget can
train on this machine (`size_rule`: `model.size=auto`'s choice, a pure function of the budget, the measured
speed and the corpus; `speed_probe`: that speed, probed and cached).

May import: system, config, core, data.
"""
