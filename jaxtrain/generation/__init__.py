"""Text from a trained state: the decoding engine with its key-value cache (`decode`: `generate`,
`stream`) and the samples written at the end of a run (`samples`).

May import: system, config, core, data.
"""
