"""Text in, token batches out. The one entry for what a run needs is `corpus`: `prepare` (text, token
files or a weighted mixture, as one `Corpus`), `check_lengths`, `train_iterator`, `eval_sets`,
`eval_weights`, `loss_scope`. Behind it: reading documents (`documents`: files, jsonl, parquet; the
held-out split of their stream: `heldout`), tokenizers (`tokenizer`; byte-level BPE between
`tokenizers` and tiktoken, GPT-2's by name: `bpe_tiktoken`; nanoGPT's meta.pkl read as data:
`meta_pkl`), the token cache that tokenizes a text corpus once
(`tokencache`; an entry on disk: `cache_entry`), token files read in place, ids already
(`tokenfiles`: nanoGPT's flat .bin, llm.c's shards; their ids checked once: `idscan`), the batches
of windows (`windows`), the rows of a weighted mixture (`mixture`: source names, the schedule, the
mixed batches), prompt/completion records read whole for sampling and evaluation (`records`), and
the chat format of chat records and its special tokens (`chat_format`).

May import: system, config.
"""
