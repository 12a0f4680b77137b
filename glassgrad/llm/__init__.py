"""tinygrad 0.14's `tinygrad.llm` package, for the part a program loading weights imports: `llm.gguf` (GGUF files,
`gguf_load`). tinygrad's chat models and server (`llm.model`, `llm.cli`) are applications, not here."""
