"""The language-model study (issue 34) on a tiny configuration: its corpus, its data-driven run
list, seeded reproducibility, the loss scale it picks, and its underflow maps."""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from precision_lab import pick_loss_scale  # noqa: E402
from precision_lab.studies import language_model as lm  # noqa: E402

TINY = lm.LMConfig(d=16, heads=2, layers=1, context=8, batch=2, steps=4, capture_every=2)


@pytest.fixture(scope="module")
def study() -> lm.LMResult:
    runs = (lm.RUNS[0], lm.RUNS[2], lm.LMRun("NVFP4", "te_nvfp4"))
    return lm.run_study(TINY, runs)


def test_the_corpus_is_the_named_standard_library_files() -> None:
    text, files = lm.corpus()
    root = sysconfig.get_paths()["stdlib"]
    assert list(files) == list(lm.CORPUS_FILES)
    for name, digest in files.items():
        with open(os.path.join(root, name), "rb") as f:
            raw = f.read()
        assert hashlib.sha256(raw).hexdigest() == digest
        assert raw.decode().encode("ascii", "replace").decode() in text
    assert text.isascii() and text == lm.corpus()[0]


def test_runs_are_seeded_and_reproducible(study: lm.LMResult) -> None:
    again = lm.run_study(TINY, (study.runs[0].run,))
    assert np.array_equal(again.runs[0].losses, study.runs[0].losses)
    assert again.runs[0].eval_loss == study.runs[0].eval_loss
    for k, v in again.underflow.items():
        assert np.array_equal(v, study.underflow[k])
    # every run starts from the same weights and batch: the first losses agree to rounding
    first = [r.losses[0] for r in study.runs]
    assert max(first) - min(first) < 0.05 and all(np.isfinite(r.losses).all() for r in study.runs)


def test_the_run_list_is_data() -> None:
    with pytest.raises(ValueError, match="no_such_recipe"):
        lm.run_study(TINY, (lm.LMRun("X", "no_such_recipe"),))
    with pytest.raises(ValueError, match="at least one run"):
        lm.run_study(TINY, ())


def test_the_loss_scale_is_the_one_the_library_picks(study: lm.LMResult) -> None:
    """The FP16 run starts at pick_loss_scale of the first step's FP32 gradients (here from
    plain torch: a power of two from max|g|, not moved by BLAS's last bits)."""
    data = lm._data(TINY)
    net = lm._model(TINY, data["vocab"])
    lm._loss(net, data["batches"][0], data["vocab"]).backward()
    g = np.concatenate([p.grad.numpy().ravel() for p in net.parameters()])
    want = pick_loss_scale(g, "fp16").scale
    fp16 = study.runs[1]
    assert fp16.init_scale == want == study.picked_scale
    assert fp16.scales is not None and fp16.scales[0] == want and len(fp16.scales) == TINY.steps


def test_underflow_maps(study: lm.LMResult) -> None:
    u = study.underflow
    n_params = sum(1 for _ in lm._model(TINY, study.vocab).parameters())
    assert len(study.params) == n_params and study.capture_steps == [0, 2]
    for arr in u.values():
        assert arr.shape == (n_params, 2) and ((arr >= 0) & (arr <= 1)).all()
    # a value that fp16 flushes, e4m3 (smallest subnormal 2**-9) flushes too; a loss scale
    # >= 1 only lifts values out of the flush
    assert (u[("e4m3", False)] >= u[("fp16", False)]).all()
    assert study.picked_scale is not None and study.picked_scale >= 1
    assert (u[("fp16", True)] <= u[("fp16", False)]).all()
    assert u[("e4m3", False)].max() > 0  # tiny gradients exist: the map is not trivially 0


def test_markdown_and_figure(study: lm.LMResult, tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from precision_lab.figures import fig_language_model as fig

    text = lm.markdown(study)
    for r in study.runs:
        assert f"| {r.run.label} | `{r.run.numerics}` |" in text
    assert "| FP32 | `float32` |" in text and " 0.000 |" in text  # the baseline's own gap
    fig._plot_loss(tmp_path, study)
    fig._plot_underflow(tmp_path, study)
    assert (tmp_path / "lm_loss.png").stat().st_size > 0
    assert (tmp_path / "lm_underflow.png").stat().st_size > 0
