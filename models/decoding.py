"""What an LLM's end-to-end loop needs beside the network: greedy decoding through any runtime's
``prefill`` and ``decode`` calls, and byte-level BPE ids turned back into text."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .case import Call


def greedy_generate(
    call: Call, prompt_ids: Sequence[int], *, prefill_len: int, max_new_tokens: int, eos_id: int | None
) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding through ``call("prefill", …)`` and ``call("decode", …)``.

    Returns the new tokens and the logits each was picked from, [steps, vocab].
    Stops after ``eos_id`` (included); ``eos_id=None`` always runs
    ``max_new_tokens`` steps.
    """
    length = len(prompt_ids)
    if not 0 < length <= prefill_len:
        raise ValueError(f"a prompt of {length} tokens does not fit the prefill window of {prefill_len}")
    # Padding id 0 is arbitrary: padded positions come after every real one.
    padded = torch.tensor([list(prompt_ids) + [0] * (prefill_len - length)], dtype=torch.int64)
    logits, k_cache, v_cache = call("prefill", padded, torch.tensor([length], dtype=torch.int64))
    tokens: list[int] = []
    step_logits: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        # Copies: a runtime may hand back views of memory its next call reuses.
        step_logits.append(logits.detach().reshape(-1).clone())
        token = int(step_logits[-1].argmax())
        tokens.append(token)
        if token == eos_id or step == max_new_tokens - 1:
            break
        logits, k_cache, v_cache = call(
            "decode",
            torch.tensor([[token]], dtype=torch.int64),
            torch.tensor([length + step], dtype=torch.int64),
            k_cache.clone(),
            v_cache.clone(),
        )
    return tokens, torch.stack(step_logits)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table, the alphabet of byte-level BPE tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    for extra, byte in enumerate(b for b in range(256) if b not in table):
        table[byte] = chr(256 + extra)
    return table


_UNICODE_TO_BYTE = {char: byte for byte, char in bytes_to_unicode().items()}


def decode_text(vocab: Sequence[str], ids: Sequence[int]) -> str:
    """Byte-level BPE ids → text; bytes that are not valid UTF-8 become U+FFFD."""
    spelled = "".join(vocab[index] for index in ids)
    return bytes(_UNICODE_TO_BYTE[char] for char in spelled).decode("utf-8", errors="replace")
