"""The prompt cache's disk store (`specfill serve --prompt-cache-dir DIR`).

One safetensors file per conversation, `<hash of its tokens>.safetensors`: tensors "keys" and
"values" [n_layers, Hkv, slots, D] in the model's dtype and "positions" [slots] (int64, each
slot's RoPE position), written by the backend's KVCache.save; its header's metadata (str -> str):
  format    "specfill-prompt-cache/1"
  identity  JSON: the model (its --model spec or path), backend, dtype, layers, KV heads, head size,
            vocabulary and context length; a file of another identity is skipped
  tokens    JSON list of the conversation's token ids
  slots, position_offset  the KV's slots and RoPE offset past them (core/runtime.KVState)
  exact     "1": a dense KV (reused under either policy); "0": from sparse prefill, approximate only
  fixed     the shortest prefix the KV may be cut to (prompt_cache.Entry.fixed)
  hybrid    a hybrid model's file only (core/io/hybrid_state.py): its recurrent layers' state at a
            prompt-end mark, tensors "recurrent.<layer>.<member>"; the file's KV stops at that mark
            (KVCache.save_point), the one point it can be reused at (prompt_cache.Entry.whole)
A file is written to a hidden temporary name in DIR and moved into place with os.replace (atomic:
a reader sees the whole file or none; a failed write leaves nothing). At startup only the headers
are read (a corrupt, foreign or unreadable file is skipped with one log line); an entry's KV is read
when a prompt reuses it (a file whose KV or recurrent part does not fit the model is then a miss,
with one log line). The files' bytes are bounded by `max_bytes`: the oldest go first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

from specfill.core.runtime import KVState

from .prompt_cache import Entry

FORMAT = "specfill-prompt-cache/1"
SUFFIX = ".safetensors"
log = logging.getLogger("specfill.serve")


def identity(model: Any, name: str | None) -> dict[str, Any]:
    """What a file must match to be reused: the model and the shape and dtype of its KV."""
    args = model.args
    return {
        "model": name,
        "backend": model.backend,
        "dtype": str(model.dtype).rsplit(".", 1)[-1],
        "layers": args.num_hidden_layers,
        "kv_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "vocab": args.vocab_size,
        "context": args.max_position_embeddings,
    } | ({"recurrent": list(args.recurrent_layers)} if getattr(args, "hybrid", False) else {})


def read_header(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, checked against the file's size (ValueError: not a whole file)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(size - 8, 1 << 28):
            raise ValueError(f"header of {length} bytes in a file of {size}")
        header = json.loads(f.read(length))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end != size:
        raise ValueError(f"{size} bytes, the header describes {8 + length + end} (truncated?)")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    return meta


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone since it was listed: read (and skipped) as such
        return 0.0


class PromptStore:
    """The files of one directory for one model (see the module doc)."""

    def __init__(self, directory: str | os.PathLike, model: Any, name: str | None, max_bytes: int | None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.identity = identity(model, name)
        self.max_bytes = max_bytes

    def files(self) -> list[Path]:
        return [p for p in self.directory.glob(f"*{SUFFIX}") if not p.name.startswith(".")]

    @property
    def nbytes(self) -> int:
        total = 0
        for path in self.files():
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    def scan(self) -> list[Entry]:
        """The directory's entries for this model, disk-only (their KV unread), oldest first."""
        entries, foreign = [], 0
        for path in sorted(self.files(), key=mtime):
            try:
                meta = read_header(path)
                if json.loads(meta["identity"]) != self.identity:
                    foreign += 1
                    continue
                tokens = [int(t) for t in json.loads(meta["tokens"])]
                slots, offset = int(meta["slots"]), int(meta["position_offset"])
                if not 0 < slots + offset <= len(tokens):
                    raise ValueError(f"{slots} + {offset} slots for {len(tokens)} tokens")
                if ("recurrent" in self.identity) != ("hybrid" in meta):
                    raise ValueError("a hybrid model's file without its recurrent state (or the reverse)")
                # oldest first, and older than any entry made from now on (time.monotonic() > 0)
                entries.append(
                    Entry(
                        tokens,
                        None,
                        exact=meta["exact"] == "1",
                        fixed=int(meta["fixed"]),
                        used=-1e9 + len(entries),
                        path=str(path),
                        stored=slots + offset,
                        whole="hybrid" in meta,
                    )
                )
            except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                log.warning("prompt cache: skipping %s: %s", path, err)
        if foreign:
            log.warning(
                "prompt cache: skipping %d file(s) in %s of another model, dtype or backend (not %s)",
                foreign,
                self.directory,
                json.dumps(self.identity, sort_keys=True),
            )
        if entries:
            log.info("prompt cache: %d conversation(s) on disk in %s", len(entries), self.directory)
        return entries

    def path_for(self, tokens: list[int]) -> Path:
        digest = hashlib.sha256(json.dumps([self.identity, tokens]).encode()).hexdigest()[:32]
        return self.directory / f"{digest}{SUFFIX}"

    def save(self, entry: Entry) -> tuple[str, int, list[str]]:
        """Write an entry atomically; (its path, the tokens its file's KV stands for, the paths the
        bound then evicted). A hybrid's cache writes its KV up to its latest prompt-end mark only."""
        kv = entry.kv
        point = getattr(kv.cache, "save_point", None)  # a hybrid's cache: where it kept the recurrent state
        slots = kv.slots if point is None else point(kv.slots)
        path = self.path_for(entry.tokens)
        meta = {
            "format": FORMAT,
            "identity": json.dumps(self.identity, sort_keys=True),
            "tokens": json.dumps(entry.tokens),
            "slots": str(slots),
            "position_offset": str(kv.position_offset),
            "exact": "1" if entry.exact else "0",
            "fixed": str(entry.fixed),
        }
        temp = self.directory / f".{path.stem}.{os.getpid()}.tmp{SUFFIX}"
        try:
            kv.cache.save(str(temp), slots, meta)
            os.replace(temp, path)
        finally:
            if temp.exists():
                temp.unlink()
        return str(path), slots + kv.position_offset, self._evict(keep=path)

    def _evict(self, keep: Path) -> list[str]:
        """Delete the oldest files (`keep`, the one just written, last) until the directory's bytes
        are within the bound; the paths deleted."""
        if self.max_bytes is None:
            return []
        files = sorted(self.files(), key=lambda p: (p == keep, mtime(p)))  # the one just written last
        sizes = {p: p.stat().st_size for p in files}
        total, gone = sum(sizes.values()), []
        for path in files:
            if total <= self.max_bytes:
                break
            total -= sizes[path]
            self.delete(str(path))
            gone.append(str(path))
        return gone

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def load(self, entry: Entry) -> KVState:
        """The entry's KV read back into a new cache of the model (ValueError / OSError: unusable)."""
        meta = read_header(Path(entry.path))
        slots, offset = int(meta["slots"]), int(meta["position_offset"])
        if json.loads(meta["identity"]) != self.identity or json.loads(meta["tokens"]) != entry.tokens:
            raise ValueError("the file changed since it was listed")
        cache = self.model.ops.new_cache(self.model.model, slots)
        if cache.load(entry.path) != slots:
            raise ValueError(f"the file holds another number of slots than its header's {slots}")
        os.utime(entry.path)  # recently used: the last to go when the directory is full
        return KVState(cache, slots, offset)
