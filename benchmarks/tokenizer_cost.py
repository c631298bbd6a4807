"""What counting a prompt costs: the estimate, a model's tokenizer inline and off the event
loop, and how long each blocks the loop.

    python benchmarks/tokenizer_cost.py [--repeat N]

Tokenizers: the tiny model's (an 8,192-token byte-level BPE, ``tests/tiny_model.py``) and a
65,536-token one trained the same way (a production-sized vocabulary; both on the corpus of
``tests/token_corpus.py``, seed 0). Prompts: English prose, Chinese and code from the corpus'
seed 1, cut to about 1,000 tokens of the tokenizer, counted as a completion prompt; a chat
prompt goes through the chat template first (ChatML, as the tiny model's). Prints a table of
microseconds per 1,000 tokens, and the event loop's longest stall while a 32,000-token prompt
is counted inline and off the loop (``LocalTokenizer.offload_chars``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shuniu.core.api.openai import parse_request
from shuniu.core.tokenization.chat_template import ChatTemplate
from shuniu.core.tokenization.local import LocalTokenizer
from shuniu.core.tokens import count_tokens

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import tiny_model  # type: ignore[import-not-found]  # noqa: E402
import token_corpus  # type: ignore[import-not-found]  # noqa: E402

sys.path.pop(0)


def _tokenizer(vocab: int, texts: list[str]) -> LocalTokenizer:
    tok = tiny_model.train_tokenizer(texts, vocab)  # the same recipe, another vocabulary size
    return LocalTokenizer(tok, ChatTemplate(tiny_model.CHAT_TEMPLATE), f"bpe-{vocab}")


def _prompt(tok: LocalTokenizer, kind: str, tokens: int) -> str:
    text = "".join(t for k, t in token_corpus.documents(seed=1, per_kind=60) if k == kind)
    lo, hi = 0, len(text)
    while lo < hi:  # the shortest prefix with at least `tokens` tokens
        mid = (lo + hi) // 2
        if tok.count_text(text[:mid]) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return text[:lo]


def _us(fn: Any, repeat: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        runs.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(runs)


async def _stall(tok: LocalTokenizer, prompt: str, offload: bool) -> tuple[float, float]:
    """(longest event-loop gap while the prompt is counted, ms; the count's own wall time, ms)."""
    tok.offload_chars = 0 if offload else len(prompt) + 1
    req = parse_request(json.dumps({"model": "m", "prompt": prompt}).encode(), "completions", "r", 0.0)
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = loop.time()
        while not done:
            await asyncio.sleep(0)
            now = loop.time()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = time.perf_counter()
    await tok.count(req)
    took = time.perf_counter() - start
    done = True
    await task
    return max(gaps) * 1e3, took * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=200, help="counts per timing run (default 200)")
    args = parser.parse_args()
    console = Console()
    texts = token_corpus.training_texts()
    with console.status("training the tokenizers"):
        toks = [_tokenizer(8192, texts), _tokenizer(65536, texts)]
    table = Table(title="µs per 1,000-token prompt (median of 5 runs)")
    for col in (
        "tokenizer",
        "prompt",
        "estimate",
        "tokenizer inline",
        "chat: template + tokenizer",
        "off the loop",
    ):
        table.add_column(col, justify="right" if col != "tokenizer" else "left")
    loop = asyncio.new_event_loop()
    for tok in toks:
        for kind in ("english", "chinese", "code"):
            prompt = _prompt(tok, kind, 1000)
            chat = parse_request(
                json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode(),
                "chat",
                "r",
                0.0,
            )
            completion = parse_request(
                json.dumps({"model": "m", "prompt": prompt}).encode(), "completions", "r", 0.0
            )
            tok.offload_chars = len(prompt) + 10_000
            inline = _us(lambda p=prompt, t=tok: t.count_text(p), args.repeat)
            templated = _us(lambda r=chat, t=tok: loop.run_until_complete(t.count(r)), args.repeat)
            tok.offload_chars = 0
            off = _us(lambda r=completion, t=tok: loop.run_until_complete(t.count(r)), args.repeat // 4)
            estimate = _us(lambda p=prompt: count_tokens(p), args.repeat)
            table.add_row(
                tok.name, kind, f"{estimate:.0f}", f"{inline:.0f}", f"{templated:.0f}", f"{off:.0f}"
            )
    console.print(table)

    stalls = Table(title="event loop's longest stall while a 32,000-token prompt is counted")
    for col in ("tokenizer", "counted", "longest stall ms", "count took ms"):
        stalls.add_column(col, justify="right" if col != "tokenizer" else "left")
    for tok in toks:
        big = _prompt(tok, "english", 1000) * 32
        for offload in (False, True):
            stall, took = loop.run_until_complete(_stall(tok, big, offload))
            stalls.add_row(tok.name, "off the loop" if offload else "inline", f"{stall:.2f}", f"{took:.2f}")
        tok.close()
    console.print(stalls)
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
