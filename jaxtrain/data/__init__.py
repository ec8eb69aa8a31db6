"""Text in, token batches out: reading documents (`documents`: files, jsonl, parquet), tokenizers
(`tokenizer`), the tokenized corpus with its cache and split (`corpus`), and the window batches
each process reads (`corpus.train_iterator`, `eval_batches`); weighted mixtures of several
sources (`mixture`: `data.mixture`'s schedule, batches and per-source validation sets).

May import: system, config.
"""
