"""Text from a trained state: the decoding engine (`decode`: `generate`, `stream`; the model's own
forward pass, extending a key-value cache), the samples written at the end of a run (`samples`),
completions of many prompts with the log-likelihood of given continuations (`complete`:
`complete`, `score`), the assistant's reply in a conversation with a chat model (`reply`:
`chat_reply`, `stream_reply`), and what of a prompt fits the model's context, said the same way
by every command (`fit`).

May import: system, config, core, data.
"""
