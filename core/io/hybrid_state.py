"""A hybrid model's recurrent state in a prompt-cache file (serve/prompt_store.py), backend-neutral.

A hybrid cache (recurrent layers beside attention: backends/mlx/hybrid_cache.py and
backends/torch_cuda/hybrid_cache.py) is written at one point only, a prompt-end mark: the
attention layers' keys and values of its first `slots` slots (the file's "keys" / "values" /
"positions", as any cache's) and the recurrent layers' arrays as they were at that mark, tensors
"recurrent.<layer>.<member>" (a layer's cache holds a list of arrays: conv state, SSM /
delta-rule state, in its backend's order; a member still None is not written). The header's
metadata "hybrid" (JSON) proves they belong together:
  slots      the mark's slot count (equal to the keys' slots; the store checks its header's "slots")
  attention  the model layers holding keys, in the order of the keys' first axis
  recurrent  the model layers holding a recurrent state
  states     per recurrent layer, per member: [shape, dtype] or null (None when written)
Reading checks every item against the file's tensors and the model's cache (its layer lists, its
members per layer); any difference is a ValueError naming it: the prompt cache then treats the
file as a miss (never a partial or inexact reuse).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

KEY = "hybrid"  # the header's metadata key
PREFIX = "recurrent."


def tensor_name(layer: int, member: int) -> str:
    return f"{PREFIX}{layer}.{member}"


def pack(
    slots: int,
    attention: Sequence[int],
    recurrent: Sequence[int],
    states: Sequence[Sequence[Any]],
    dtype_name: Callable[[Any], str],
) -> tuple[dict[str, Any], str]:
    """(the recurrent tensors to write by name, the "hybrid" metadata value) for the state `states`
    (per recurrent layer, its arrays or None) at `slots` slots."""
    if len(states) != len(recurrent):
        raise ValueError(f"{len(states)} recurrent states for {len(recurrent)} recurrent layers")
    tensors = {
        tensor_name(layer, j): array
        for layer, state in zip(recurrent, states)
        for j, array in enumerate(state)
        if array is not None
    }
    layout = {
        "slots": int(slots),
        "attention": [int(i) for i in attention],
        "recurrent": [int(i) for i in recurrent],
        "states": [[None if a is None else [list(map(int, a.shape)), dtype_name(a)] for a in s] for s in states],
    }
    return tensors, json.dumps(layout)


def unpack(
    metadata: dict[str, str],
    tensors: dict[str, Any],
    slots: int,
    attention: Sequence[int],
    recurrent: Sequence[int],
    members: Sequence[int],
    dtype_name: Callable[[Any], str],
) -> list[list[Any]]:
    """The recurrent state read back (per recurrent layer, its arrays or None), after checking the
    file's "hybrid" metadata and tensors against a cache of `slots` slots (the file's keys'), its
    `attention` and `recurrent` layers and `members` arrays per recurrent layer (ValueError)."""
    raw = metadata.get(KEY)
    if raw is None:
        raise ValueError("the file holds no recurrent state (not written from a hybrid model's cache)")
    try:
        layout = json.loads(raw)
        marked, states = int(layout["slots"]), layout["states"]
        layers = [int(i) for i in layout["attention"]], [int(i) for i in layout["recurrent"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"unreadable recurrent-state metadata: {err}") from None
    if marked != slots:
        raise ValueError(f"the file's recurrent state is at slot {marked}, its keys hold {slots} slots")
    if layers != (list(attention), list(recurrent)):
        raise ValueError(
            f"the file's attention / recurrent layers {layers[0]} / {layers[1]}, the model's "
            f"{list(attention)} / {list(recurrent)}"
        )
    if not isinstance(states, list) or [len(s) if isinstance(s, list) else -1 for s in states] != list(members):
        raise ValueError(f"the file's recurrent arrays per layer do not match the model's {list(members)}")
    out, named = [], set()
    for layer, declared in zip(recurrent, states):
        arrays = []
        for j, item in enumerate(declared):
            name = tensor_name(layer, j)
            if item is None:
                arrays.append(None)
                continue
            array = tensors.get(name)
            if array is None:
                raise ValueError(f"recurrent array {name} is missing")
            shape, dtype = [int(d) for d in item[0]], str(item[1])
            if list(array.shape) != shape or dtype_name(array) != dtype or not shape or shape[0] != 1:
                raise ValueError(
                    f"recurrent array {name} is {list(array.shape)} {dtype_name(array)}, declared {shape} {dtype}"
                )
            named.add(name)
            arrays.append(array)
        out.append(arrays)
    extra = sorted(n for n in tensors if n.startswith(PREFIX) and n not in named)
    if extra:
        raise ValueError(f"undeclared recurrent arrays {extra[:3]}")
    return out
