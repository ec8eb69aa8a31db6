"""The model and what turns it into compiled programs: the Flax NNX model and its kernels (`model`,
`ops`; `kvcache`, the key-value cache its one forward pass extends when it generates; `draws` makes
its initial params fast to compile; `attention` picks the attention kernel, `loss` holds the
cross-entropy; `lora` adds low-rank adapters and says which params train), the optimizer and its
matmul FLOPs per step (`optim`), the pure train and eval steps (`steps`) and the per-group
statistics they report (`stats`), the device mesh and shardings (`mesh`), the CPU policy (`cpu`),
and `programs.build`, the one way a config becomes jitted init/train/eval programs.

May import: system, config.
"""
