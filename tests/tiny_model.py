"""A tiny, randomly initialised Llama model with its tokenizer, built locally (no download).

The fixture behind every test and benchmark that runs a real engine (vLLM's CPU build) on a
machine without accelerators: hidden size 128, 2 layers, 4 query / 2 KV heads of 32, a gated
MLP of 256, a byte-level BPE tokenizer of 8,192 tokens trained here on a multilingual corpus
(``tests/token_corpus.py``: Chinese, English, code, mixed, JSON; so Chinese prompts count about
as a Chinese-serving model counts them), a ChatML-style chat template, float32 safetensors
(~2.8 M parameters, ~11 MB). It is the ``tiny-llama`` model profile of the simulator
(``backends/sim/data/models.yaml``).

Generated text is random: assert on protocol, token counts (``ignore_eos``, ``temperature: 0``)
and metrics, never on words.

Building needs ``torch``, ``transformers`` and ``tokenizers`` (the vLLM virtualenv has them)
and the training text, which the project's own environment writes (it needs ``jieba``'s
dictionary, a test dependency)::

    python tests/token_corpus.py .cache/tiny-corpus.jsonl
    .venv-vllm/bin/python tests/tiny_model.py --corpus .cache/tiny-corpus.jsonl [OUT_DIR]

:func:`ensure_built` does both from the project's environment (tests and benchmarks call it).

Serve it with vLLM's CPU build (docs/testing.md)::

    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m \
        vllm.entrypoints.openai.api_server --model OUT_DIR --dtype float32 \
        --max-model-len 1024 --enforce-eager --port 8011

Building is idempotent: a directory that already holds every file is left alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_DIR", "FILES", "RECIPE", "ensure_built", "is_built", "make_tiny_model", "train_tokenizer"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".cache" / "tiny-model"
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "recipe.txt",
)
"""Files a finished model directory holds (``special_tokens_map.json`` is optional: newer
``transformers`` releases fold it into ``tokenizer_config.json``)."""

VOCAB = 8192
RECIPE = "tiny-llama: 8192-token byte-level BPE on tests/token_corpus.py seed 0, weighted"
"""Written to ``recipe.txt``: a directory built by another recipe is rebuilt."""
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}
"""Must match the ``tiny-llama`` profile in ``backends/sim/data/models.yaml``."""


def is_built(out_dir: Path) -> bool:
    """Whether ``out_dir`` already holds a finished model (every required file)."""
    out_dir = Path(out_dir)
    required = [f for f in FILES if f != "special_tokens_map.json"]
    if not all((out_dir / f).is_file() and (out_dir / f).stat().st_size > 0 for f in required):
        return False
    return (out_dir / "recipe.txt").read_text().strip() == RECIPE


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB) -> Any:
    """The tiny model's tokenizer (a ``tokenizers.Tokenizer``) trained on ``texts``. Needs only
    ``tokenizers``: the token-count checks train the same one in the project's environment."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def read_corpus(path: Path) -> list[str]:
    """The training text :func:`token_corpus.write_training_text` wrote (one JSON string a line)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def ensure_built(python: Path, out_dir: Path = DEFAULT_DIR) -> Path:
    """Build the model into ``out_dir`` unless it is there, from the project's environment:
    the training text here (``jieba`` is a test dependency), the model with ``python`` (the
    vLLM virtualenv's)."""
    import subprocess

    out_dir = Path(out_dir)
    if is_built(out_dir):
        return out_dir
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from token_corpus import write_training_text  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    corpus = write_training_text(out_dir.parent / f"{out_dir.name}-corpus.jsonl")
    subprocess.run(
        [str(python), str(Path(__file__)), "--corpus", str(corpus), str(out_dir)], check=True, timeout=600
    )
    return out_dir


def make_tiny_model(corpus: list[str], out_dir: Path = DEFAULT_DIR) -> Path:
    """Build the tiny model and a tokenizer trained on ``corpus`` into ``out_dir`` (created
    if missing) and return it.

    Deterministic (fixed seeds) and idempotent: when ``out_dir`` already holds every file
    nothing is rebuilt. Written to a sibling temporary directory first and renamed, so an
    interrupted build never leaves a half-written model that looks finished.
    """
    out_dir = Path(out_dir)
    if is_built(out_dir):
        return out_dir
    try:
        import tokenizers  # noqa: F401  (train_tokenizer's)
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"building the tiny model needs torch, transformers and tokenizers ({exc}); run it "
            "with the vLLM virtualenv's Python: .venv-vllm/bin/python tests/tiny_model.py"
        ) from exc

    import shutil
    import tempfile

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is no secret
    try:
        # 1. tokenizer: byte-level BPE trained on the multilingual corpus
        tok = train_tokenizer(corpus)
        bos_id = tok.token_to_id("<s>")
        eos_id = tok.token_to_id("</s>")
        pad_id = tok.token_to_id("<pad>")
        im_end_id = tok.token_to_id("<|im_end|>")
        hf_tok = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            additional_special_tokens=["<|im_start|>", "<|im_end|>"],
            model_max_length=2048,
        )
        hf_tok.chat_template = CHAT_TEMPLATE
        hf_tok.save_pretrained(tmp)
        cfg_path = tmp / "tokenizer_config.json"
        tcfg = json.loads(cfg_path.read_text())
        tcfg["chat_template"] = CHAT_TEMPLATE
        tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        tcfg["add_bos_token"] = False
        tcfg["add_eos_token"] = False
        cfg_path.write_text(json.dumps(tcfg, indent=2))
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        (tmp / "recipe.txt").write_text(RECIPE + "\n")

        # 2. model: tiny Llama, random init, float32 safetensors
        config = LlamaConfig(
            vocab_size=len(hf_tok),
            **ARCHITECTURE,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            bos_token_id=bos_id,
            eos_token_id=[eos_id, im_end_id],
            pad_token_id=pad_id,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        model.eval()
        model.save_pretrained(tmp, safe_serialization=True)
        gen = {"bos_token_id": bos_id, "eos_token_id": [eos_id, im_end_id], "pad_token_id": pad_id}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))

        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors writes its file private
        # 3. move into place (an earlier half-built directory is replaced)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    corpus_file = None
    if "--corpus" in args:
        at = args.index("--corpus")
        corpus_file = Path(args[at + 1])
        del args[at : at + 2]
    out = Path(args[0]) if args else DEFAULT_DIR
    if is_built(out):
        print(f"{out}: already built")
        return 0
    if corpus_file is None:
        print(
            "the training text is missing: python tests/token_corpus.py FILE, then --corpus FILE",
            file=sys.stderr,
        )
        return 2
    path = make_tiny_model(read_corpus(corpus_file), out)
    params = json.loads((path / "config.json").read_text())
    print(f"wrote {path}: vocab={params['vocab_size']} files={sorted(p.name for p in path.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
