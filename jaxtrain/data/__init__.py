"""Text in, token batches out. The one entry for what a run needs is `corpus` (`prepare`,
`check_lengths`, `train_iterator`, `eval_sets`, `loss_scope`). Behind it: reading
documents (`documents`; the held-out split of their stream: `heldout`), tokenizers (`tokenizer`,
`bpe_tiktoken`, nanoGPT's meta.pkl read as data: `meta_pkl`), the token cache (`tokencache`, an
entry on disk: `cache_entry`), token files read in place (`tokenfiles`, their ids checked once:
`idscan`), batches of windows (`windows`), weighted mixtures (`mixture`), records read whole for
sampling and evaluation (`records`) and the chat format (`chat_format`).

May import: system, config.
"""
