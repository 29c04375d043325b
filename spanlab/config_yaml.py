"""Reading a config file's YAML: what PyYAML would take or crash on that no config holds, refused in one line.

PyYAML builds whatever a YAML document says, and a config is read before anything else can check it, so the
loader itself refuses what only a mistake or an attack writes:

* a key given twice in one mapping (PyYAML keeps the last silently);
* a key that is a list or mapping (``? [a, b]``: Python's dict cannot hold it, "unhashable type");
* a merge key (``<<: *base``): YAML 1.1 only, and its override rules hide which value a key ends up with;
* an integer written with more than :data:`MAX_INT_CHARS` characters (Python refuses to read one of over 4,300
  digits, and no config number is past 2**31-1);
* aliases that expand the document by more than :data:`MAX_ALIAS_VALUES` values or :data:`MAX_ALIAS_BYTES`
  bytes: a "billion laughs" of nested aliases, or one long string aliased thousands of times (an 82 KB file
  that reads as 41 MB), measured over the composed graph before anything is built, so refusing costs what the
  text does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spanlab.errors import ConfigError

MAX_ALIAS_VALUES = 100_000  # values a config's aliases may add once expanded: far above any real one's
MAX_ALIAS_BYTES = 1 << 20  # bytes of scalar text the aliases may add: 500 uses of a 2 KB prompt, say
MAX_INT_CHARS = 64  # an integer's text; any config number is < 2**31 (10 digits), Python reads < 4,300
_COUNT_CAP = 10**18  # expanded sizes are counted up to here (a bomb's true size has hundreds of digits)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A YAML loader that refuses keys a config never has (twice in one mapping, non-scalar, merge keys) and
    over-long integers. It parses with libyaml where PyYAML was built with it: the pure-Python parser takes
    seconds per MB of config."""


def _refuse(node: yaml.Node, why: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, why, node.start_mark)


def _checked_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            raise _refuse(key_node, "a YAML merge key (`<<:`), which configs do not support: write the keys out "
                          "(an alias such as `*base` may stand for a whole value)")
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            raise _refuse(key_node, f"a key that is a {kind} (`? [...]`); a config's keys are names")
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise _refuse(key_node, f"duplicate key {key!r}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _checked_int(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    if len(node.value) > MAX_INT_CHARS:
        raise _refuse(node, f"an integer of {len(node.value):,} characters (a config's numbers are at most "
                      "2,147,483,647)")
    return loader.construct_yaml_int(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _checked_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _checked_int)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping: UTF-8, valid YAML, within the rules above; every problem a one-line ConfigError."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder, not a file")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    try:
        data = _load(text)
    except RecursionError:
        raise ConfigError(f"{p} is nested too deep to be a config") from None
    except ConfigError as exc:
        raise ConfigError(f"{p} {exc}") from None
    except yaml.constructor.ConstructorError as exc:  # one of the refusals above: it names what and where
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise ConfigError(f"{p} holds {exc.problem}{where}") from None
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise ConfigError(f"{p} is not valid YAML: {exc.problem or exc.context}{where}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    except (ValueError, TypeError, OverflowError) as exc:  # a value PyYAML matched but cannot build (2001-13-45)
        raise ConfigError(f"{p} holds a value YAML cannot read: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of sections, not {type(data).__name__}")
    return data


def _load(text: str) -> Any:
    """Compose the document, refuse it if its aliases add more than the limits once expanded, then build it.
    Only what aliases add counts: a long config of plain keys is no bomb."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and "*" in text:
            values, size = _alias_growth(node)
            if values > MAX_ALIAS_VALUES:
                raise ConfigError(f"holds {'far ' if values >= _COUNT_CAP // 2 else ''}more than {MAX_ALIAS_VALUES} "
                                  "values beyond its own text once its aliases are expanded (a config's aliases "
                                  "add far fewer: an alias bomb?)")
            if size > MAX_ALIAS_BYTES:
                shown = "far more than" if size >= _COUNT_CAP // 2 else f"{size:,} bytes,"
                raise ConfigError(f"holds aliases that expand it by {shown} more than {MAX_ALIAS_BYTES:,} bytes "
                                  "(a long value aliased many times: write it once, or shorten it)")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


def _alias_growth(root: yaml.Node) -> tuple[int, int]:
    """How many nodes and how many bytes of scalar text aliases add to ``root`` once each is copied out (a
    "billion laughs" document: 10^9 nodes from a few lines; one 2 KB string aliased 20,000 times: 40 MB): its
    expanded size less its size as written, counted over the composed graph (shared nodes once each)."""
    sizes: dict[int, tuple[int, int]] = {}
    written_bytes = 0
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if children_done or not children:
            own = len(node.value.encode("utf-8", "surrogatepass")) if isinstance(node, yaml.ScalarNode) else 0
            written_bytes += own
            sizes[id(node)] = (min(_COUNT_CAP, 1 + sum(sizes[id(c)][0] for c in children)),
                               min(_COUNT_CAP, own + sum(sizes[id(c)][1] for c in children)))
            open_.discard(id(node))
            continue
        if id(node) in open_:
            raise ConfigError("holds an alias that contains itself (a recursive structure)")
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    values, size = sizes[id(root)]
    return values - len(sizes), size - written_bytes
