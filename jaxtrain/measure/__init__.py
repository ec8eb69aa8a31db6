"""What a run costs and how fast it goes: the estimate before it starts (`estimate`: memory per
device against what the machine has, and the devices' FLOP/s peak), the lines a run says about
itself before its first step (`summary`: data, model, compute, memory; the first speed reading;
at its end, where the time went), and what is measured as it trains (`speed`: tokens/s, MFU, ETA;
`memory`: peak memory, the container's limit, and a warning when it runs low).

May import: system, config, core, data.
"""
