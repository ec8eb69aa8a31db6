"""Text in, token batches out: reading documents (`documents`: files, jsonl, parquet), tokenizers
(`tokenizer`), the tokenized corpus with its cache, split and loss mask (`corpus`), token files
read in place, ids already (`tokenfiles`: nanoGPT's flat .bin, llm.c's shards), the window
batches each process reads (`windows`: `train_iterator`, `eval_batches`, re-exported by `corpus`),
prompt/completion records read whole for sampling and evaluation (`records`), the chat format of
chat records and its special tokens (`chat_format`), and weighted mixtures of several sources
(`mixture`: `data.mixture`'s schedule, batches and per-source validation sets).

May import: system, config.
"""
