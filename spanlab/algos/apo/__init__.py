"""APO: prompt optimization by beam search with textual gradients (``algorithm: apo``); no torch."""
