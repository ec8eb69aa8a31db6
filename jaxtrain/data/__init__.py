"""Text in, token batches out: reading documents (`documents`: files, jsonl, parquet), tokenizers
(`tokenizer`), the tokenized corpus with its cache and split (`corpus`), and the window batches
each process reads (`corpus.train_iterator`, `eval_batches`).

May import: system, config.
"""
