"""Each architecture against transformers: greedy tokens from the HF folder and from an F32 GGUF, logits of a
quantized GGUF against its dequantized weights, the engine (prefix cache, n-gram speculation), and the
architecture x type table of docs/models.md against the loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.executor.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from backend.executor.model.families import FAMILIES as MODEL_CLASSES
from backend.loading.gguf.weights import tensor_support
from backend.loading.loader import load_model
from tests.backend.backend_process import BackendProcess
from tests.backend.family_models import FAMILIES, build, hf_greedy, write_family_gguf
from tests.backend.model_harness import paged_greedy, prefill_logits

NEW_TOKENS = 24
PROMPTS = [[72, 101, 108, 108, 111], [100, 101, 102, 32, 102, 40, 120, 41, 58] * 3, [49, 44, 32, 50, 44, 32, 51]]
# A Q8_0 matrix product (the file's blocks, activations quantized per block) against the float product of the
# same dequantized weights: the logits of these tiny models (|logit| ~ 1) agree to this.
Q8_0_ATOL = 0.05


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    spec = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(spec.name)
    model = build(spec, root / "hf")
    return {"spec": spec, "hf": model, "root": root,
            "reference": [hf_greedy(model, p, NEW_TOKENS) for p in PROMPTS]}


def test_every_architecture_has_a_model_class() -> None:
    assert set(MODEL_CLASSES) == set(SUPPORTED_ARCHITECTURES)


def test_hf_folder_greedy_equals_transformers(family: dict[str, Any]) -> None:
    ours = load_model(family["root"] / "hf")
    assert type(ours.model) is MODEL_CLASSES[ours.config.architecture]
    assert [paged_greedy(ours.model, p, NEW_TOKENS) for p in PROMPTS] == family["reference"]


def test_hf_folder_logits_equal_transformers(family: dict[str, Any]) -> None:
    ours = load_model(family["root"] / "hf")
    for prompt in PROMPTS:
        with torch.inference_mode():
            expected = family["hf"](torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(prefill_logits(ours.model, prompt), expected, rtol=1e-4, atol=1e-4)


def test_gguf_greedy_equals_transformers(family: dict[str, Any]) -> None:
    path = write_family_gguf(family["spec"], family["hf"], family["root"] / "f32.gguf")
    ours = load_model(path)
    assert ours.config.architecture == family["spec"].architecture
    assert [paged_greedy(ours.model, p, NEW_TOKENS) for p in PROMPTS] == family["reference"]


def test_quantized_gguf_logits_near_dequantized(family: dict[str, Any]) -> None:
    path = write_family_gguf(family["spec"], family["hf"], family["root"] / "q8_0.gguf", Q.Q8_0)
    native = load_model(path, quantization="auto")
    dequantized = load_model(path)
    for prompt in PROMPTS:
        torch.testing.assert_close(prefill_logits(native.model, prompt), prefill_logits(dequantized.model, prompt),
                                   rtol=0, atol=Q8_0_ATOL)
    # Decode steps run the C++ decode stack where the family's layer allows it: the same tokens as the loop.
    fused = [paged_greedy(native.model, p, 8) for p in PROMPTS]
    native.model.fused = None
    assert [paged_greedy(native.model, p, 8) for p in PROMPTS] == fused


def test_engine_serves_with_prefix_cache_and_speculation(family: dict[str, Any]) -> None:
    folder = family["root"] / "hf"
    engine = Engine(EngineConfig(model_path=folder, threads=1, kv_cache_memory=4 * 1024 * 1024, speculative="ngram"),
                    loaded=load_model(folder))
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)
        [first] = engine.generate_offline([PROMPTS[1]], params)
        [again] = engine.generate_offline([PROMPTS[1]], params)  # its first block now comes from the prefix cache
    finally:
        engine.shutdown()
    assert first.token_ids == again.token_ids == family["reference"][1]
    assert again.cached_tokens > 0


def test_one_request_through_the_openai_api(family: dict[str, Any], tmp_path: Path) -> None:
    path = write_family_gguf(family["spec"], family["hf"], tmp_path / f"{family['spec'].name}.gguf")
    prompt = load_model(path).tokenizer.decode(PROMPTS[2])  # ASCII: ids below 94 are the printable bytes
    backend = BackendProcess(path, tmp_path / "server.log").launch()
    try:
        backend.wait_ready()
        client = openai.OpenAI(base_url=backend.base_url, api_key="unused", max_retries=0)
        answer = client.completions.create(model="smollm2", prompt=prompt, max_tokens=NEW_TOKENS,
                                           temperature=0, extra_body={"ignore_eos": True})
    finally:
        backend.stop()
    # the engine's own detokenized text for transformers' tokens (random weights make invalid UTF-8 likely)
    engine = Engine(EngineConfig(model_path=path, threads=1, kv_cache_memory=4 * 1024 * 1024), loaded=load_model(path))
    try:
        [offline] = engine.generate_offline([PROMPTS[2]], SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                                                         temperature=0.0))
    finally:
        engine.shutdown()
    assert offline.token_ids == family["reference"][2]
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(PROMPTS[2]), NEW_TOKENS)
    assert answer.choices[0].text == offline.text


@pytest.mark.parametrize(("config", "named"), [
    ({"model_type": "qwen2_moe", "num_experts": 8}, "'qwen2_moe'"),  # shared experts beside the routed ones
    ({"model_type": "gemma3", "text_config": {}}, "'gemma3'"),  # the multimodal folder
    ({**FAMILIES["qwen3moe"].config().to_dict(), "mlp_only_layers": [0]}, "mlp_only_layers"),
])
def test_unsupported_configs_are_refused_by_name(tmp_path: Path, config: dict[str, Any], named: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=named):
        load_model(tmp_path)


def test_gemma_configs_without_layer_types_get_their_family_pattern() -> None:
    for name, expected in (("gemma2", (True, False)), ("gemma3", (True,) * 5 + (False,))):
        raw = FAMILIES[name].config().to_dict()
        del raw["layer_types"]
        assert ModelConfig.from_hf_config(raw).sliding_window_layers == expected


def test_models_doc_table_says_what_the_loader_does() -> None:
    lines = (Path(__file__).parents[4] / "docs" / "models.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| architecture | F32 |"))
    types = [cell.strip() for cell in lines[start].strip("|").split("|")][1:]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[name.strip("`")] = dict(zip(types, cells, strict=True))
    assert set(rows) == {*SUPPORTED_ARCHITECTURES, "any other"}
    for arch, cells in rows.items():
        for type_name, cell in cells.items():
            assert cell == tensor_support("mamba" if arch == "any other" else arch, type_name), (arch, type_name)
