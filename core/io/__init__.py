"""specfill.core.io: loading, backend-neutral: GGUF and safetensors readers, checkpoint ->
(ModelArgs, Hugging Face-named NumPy weights), tokenizer and chat template, the demo model and
random-weight models.

Imports run one way: gguf_file <- safetensors_file; random_model (models only) <- weights <-
tokenizer; chat_template and gguf_tokenizer <- tokenizer. Importing this package imports no
optional extra (gguf, tokenizers, jinja2 load with the modules that need them).
"""
