"""The sealed split's wordings: levels 1-3 in sentence shapes written by someone who worked from a spec alone.

Every other calc wording (``phrasings.py``: the training families and the ``family`` split) comes from the hand
that also chose the recipes, so a recipe can be fitted to them without anyone meaning to. The templates in
``sealed_wordings.json`` were written from the arithmetic shapes, the number ranges and "everyday English,
varied", by an author who never saw the training families, the held-out families or the model's answers. The
numbers are drawn by ``tasks.py``'s own draws; only the wording is sealed.

The file is pinned by digest: a changed wording is a different split, and loading refuses it. The split checks a
recipe already chosen on the other splits; it never chooses one (each look is logged in ``docs/results.md``).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

WORDINGS = Path(__file__).with_name("sealed_wordings.json")
SHA256 = "c84a4d1e0ddce97fbca3bd64f345f08e0e6b4ed26022e6b6223fbc12fd794f08"


@cache
def sealed_templates() -> dict[str, tuple[str, ...]]:
    """kind -> its sealed templates (``str.format`` slots as ``tasks.py`` draws them), checked against the digest."""
    data = WORDINGS.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise ValueError(f"{WORDINGS}: sha256 {digest[:12]}... is not the pinned {SHA256[:12]}...: the sealed "
                         "wordings were changed (a new wording set is a new split: pin it anew, on purpose)")
    return {kind: tuple(templates) for kind, templates in json.loads(data).items()}
