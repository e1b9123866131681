"""The README's "Use it in a model" snippet runs as written (in a temporary directory, as a
new user would paste it)."""

import os
import re

import pytest

pytest.importorskip("transformers", reason="the README snippet builds a transformers Llama "
                    "(requirements.txt)")

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def section_code(title: str) -> str:
    """The first ```python block of the README section ``## title``."""
    with open(README) as fh:
        text = fh.read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start:end], re.S)
    assert blocks, f"README section {title!r} has no python block"
    return blocks[0]


def test_use_it_in_a_model_snippet_runs(tmp_path, monkeypatch, capsys):
    code = section_code("Use it in a model")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md:Use it in a model", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "MarlinLinear(in_features=512, out_features=256" in out
    assert os.path.isfile(tmp_path / "llama-w4" / "model.safetensors")
    # The prompt, then 5 new tokens, fewer only where the (random) model ended on its end
    # token (LlamaConfig's eos_token_id, 2: generate stops there; about one run in ten).
    m = re.search(r"tensor\(\[\[ *1, +2, +3, +4((?:, +\d+){1,5})\]\]\)", out)
    assert m, out
    new = [int(t) for t in m.group(1).split(",")[1:]]
    assert len(new) == 5 or new[-1] == 2, out
