"""Serving a trained run over HTTP: many requests decoded together on the key-value cache
(`engine`), the queue and the worker that feeds it (`scheduler`), what a request asks for, checked
(`requests`), the run served and its prompts (`served`), and the OpenAI-compatible app with its
chat page (`app`, `page.html`).

May import: system, config, core, data, checkpoints, generation.
"""
