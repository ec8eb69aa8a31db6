"""What a run costs and how fast it goes: the estimate before it starts (`estimate`: memory per
device against what the machine has, and the devices' FLOP/s peak), the lines a run says about
itself before its first step (`summary`: data, model, compute, memory; the first speed reading;
at its end, where the time went), and what is measured as it trains (`speed`: tokens/s, MFU, ETA;
`memory`: peak memory, the container's limit, and a warning when it runs low), and what a
time budget can train on this machine (`size_rule`: `model.size=auto`'s choice, a pure function
of the budget, the measured speed and the corpus; `speed_probe`: that speed, probed and cached).

May import: system, config, core, data.
"""
