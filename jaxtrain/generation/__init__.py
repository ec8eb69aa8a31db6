"""Text from a trained state: the decoding engine with its key-value cache (`decode`: `generate`,
`stream`), the samples written at the end of a run (`samples`), and completions of many prompts
with the log-likelihood of given continuations (`complete`: `complete`, `score`), the task
scores built on them (`scoring`: loss, bpb, exact match, multiple-choice accuracy of held-out
records, for `python -m jaxtrain.eval` and `train.eval_tasks`), and the assistant's turn of a
conversation with a chat model (`reply`: `chat_reply`, `stream_reply`).

May import: system, config, core, data.
"""
