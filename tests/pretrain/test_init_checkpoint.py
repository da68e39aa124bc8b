"""`--init-checkpoint`: each format loads the same weights; a mismatch is refused whole, naming the tensor and both
shapes; a resumed run ignores it; and (slow) a real 1-rank run starts from it."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_export_import import ATOL, batch, perturbed_tiny, tf1_checkpoint  # noqa: E402, F401 (fixture)

from core.errors import InputError  # noqa: E402
from pretrain.config import model_config  # noqa: E402
from pretrain.init_checkpoint import (  # noqa: E402
    check_init_checkpoint,
    init_weights,
    load_init_checkpoint,
)
from pretrain.model import BertForPreTraining  # noqa: E402
from pretrain.tf_import import save_safetensors  # noqa: E402


def fresh(**overrides) -> BertForPreTraining:
    torch.manual_seed(99)
    return BertForPreTraining(model_config("tiny", **overrides)).eval()


def assert_same_weights(model: BertForPreTraining, source: BertForPreTraining) -> None:
    """Every tensor equal (the vocab padding rows: zero where the format does not carry them)."""
    v = source.config.vocab_size
    got, want = model.state_dict(), source.state_dict()
    for k, t in want.items():
        if k in ("embeddings.word_embeddings.weight", "mlm_head.bias"):
            assert torch.equal(got[k][:v], t[:v]), k
            assert torch.equal(got[k][v:], t[v:]) or not got[k][v:].any(), k
        else:
            assert torch.equal(got[k], t), k


@pytest.fixture(scope="module")
def checkpoints(tf1_checkpoint, tmp_path_factory) -> dict:  # noqa: F811
    """The TF1 checkpoint's model written in the other formats: safetensors (import-tf) and transformers."""
    pytest.importorskip("transformers")
    from pretrain.hf_export import export_to_hf

    source, prefix = tf1_checkpoint
    d = tmp_path_factory.mktemp("init")
    return {"source": source, "tf": prefix, "safetensors": save_safetensors(source, d / "init.safetensors"),
            "hf": export_to_hf(source, d / "hf")}


def test_every_format_loads_the_same_weights(checkpoints):
    source, prefix = checkpoints["source"], checkpoints["tf"]
    b = batch()
    with torch.no_grad():
        want = source(**b)
    paths = {"safetensors": [checkpoints["safetensors"]], "hf": [checkpoints["hf"]],
             "tf": [prefix, prefix.parent, Path(f"{prefix}.index")]}  # the prefix, its directory, one of its files
    for fmt, forms in paths.items():
        for path in forms:
            model = fresh()
            info = load_init_checkpoint(model, path)
            assert info == {"path": str(path), "format": fmt, "tensors": len(model.state_dict())}
            assert_same_weights(model, source)
            with torch.no_grad():
                got = model(**b)
            torch.testing.assert_close(got.mlm_logits, want.mlm_logits, rtol=0, atol=ATOL)
            torch.testing.assert_close(got.nsp_logits, want.nsp_logits, rtol=0, atol=ATOL)
            assert check_init_checkpoint(path, model.config) == fmt


def test_sharded_and_legacy_transformers_directories(checkpoints, tmp_path):
    """A sharded model.safetensors.index.json, and an old pytorch_model.bin with LayerNorm gamma/beta names."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf = transformers.BertForPreTraining.from_pretrained(checkpoints["hf"])
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(checkpoints["hf"] / "config.json", legacy)
    torch.save({k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                for k, v in hf.state_dict().items()}, legacy / "pytorch_model.bin")
    for path in (tmp_path / "sharded", legacy):
        model = fresh()
        assert load_init_checkpoint(model, path)["format"] == "hf"
        assert_same_weights(model, checkpoints["source"])
        assert check_init_checkpoint(path, model.config) == "hf"
    shards = sorted((tmp_path / "sharded").glob("model-0*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(InputError, match=f"{shards[-1].name} is missing"):
        load_init_checkpoint(fresh(), tmp_path / "sharded")


@pytest.mark.parametrize("fmt", ["safetensors", "hf", "tf"])
def test_mismatch_names_the_tensor_and_both_shapes_and_loads_nothing(checkpoints, fmt):
    path = checkpoints[fmt]
    expected = {  # (config override, message)
        "safetensors": [
            ({"vocab_size": 30000}, "embeddings.word_embeddings.weight has shape (30528, 64) in the checkpoint but "
                                    "(30000, 64) in this run's model (vocab_size=30000"),
            ({"intermediate_size": 128}, "encoder.layer.0.ffn_in.weight has shape (256, 64) in the checkpoint but "
                                         "(128, 64) in this run's model"),
            ({"num_hidden_layers": 3}, "has no tensor 'encoder.layer.2."),
            ({"num_hidden_layers": 1}, "has tensors the model does not, e.g. 'encoder.layer.1."),
        ],
        "hf": [
            ({"vocab_size": 30000}, "bert.embeddings.word_embeddings.weight has shape (30522, 64) but the model "
                                    "expects (30000, 64)"),
            ({"intermediate_size": 128}, "encoder.layer.0.ffn_in.weight has shape (256, 64) in the checkpoint but "
                                         "(128, 64) in this run's model"),
            ({"num_hidden_layers": 3}, "the checkpoint has 2 encoder layers"),
        ],
        "tf": [
            ({"vocab_size": 30000}, "bert/embeddings/word_embeddings has shape (30522, 64) but the model expects "
                                    "(30000, 64)"),
            ({"hidden_size": 128, "num_attention_heads": 2},
             "bert/embeddings/word_embeddings has shape (30522, 64) but the model expects (30522, 128)"),
            ({"num_hidden_layers": 3}, "no bert/encoder/layer_2"),
        ],
    }[fmt]
    for overrides, message in expected:
        model = fresh(**overrides)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(InputError) as e:
            load_init_checkpoint(model, path)
        assert str(e.value).startswith(f"{path}: ") and message in str(e.value), str(e.value)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "loaded partially"
        if fmt != "tf":  # the launcher's check (headers only) says the same
            with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
                check_init_checkpoint(path, model.config)


def test_unusable_paths_are_refused_with_a_hint(checkpoints, tmp_path):
    cfg = model_config("tiny")
    with pytest.raises(InputError, match="init checkpoint .*nope.safetensors does not exist; give a TF1"):
        check_init_checkpoint(tmp_path / "nope.safetensors", cfg)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="is not a checkpoint bertpipe reads"):
        load_init_checkpoint(fresh(), tmp_path / "notes.txt")
    run = tmp_path / "run"
    (run / "checkpoints" / "20").mkdir(parents=True)
    with pytest.raises(InputError, match="is a training run directory: export its weights with `bertpipe export-hf"):
        check_init_checkpoint(run, cfg)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with pytest.raises(InputError, match="not a readable safetensors file"):
        check_init_checkpoint(bad, cfg)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("model.ckpt-1", "model.ckpt-2"):
        for suffix in (".index", ".data-00000-of-00001"):
            shutil.copy(f"{checkpoints['tf']}{suffix}", two / f"{name}{suffix}")
    with pytest.raises(InputError, match="holds 2 TF checkpoints .*give one prefix, e.g. .*model.ckpt-2"):
        check_init_checkpoint(two, cfg)
    assert load_init_checkpoint(fresh(), two / "model.ckpt-2")["format"] == "tf"


def test_unpadded_safetensors_and_functional_config_differences(checkpoints, tmp_path, caplog):
    """A file with vocab_size rows (not padded) loads; a checkpoint of another activation warns."""
    from safetensors.torch import load_file, save_file

    source = checkpoints["source"]
    state = load_file(checkpoints["safetensors"])
    for k in ("embeddings.word_embeddings.weight", "mlm_head.bias"):
        state[k] = state[k][: source.config.vocab_size].contiguous()
    other = dict(source.config.to_dict(), hidden_act="relu")
    save_file(state, str(tmp_path / "unpadded.safetensors"), metadata={"bert_config": json.dumps(other)})
    model = fresh()
    with caplog.at_level(logging.WARNING, logger="pretrain.init_checkpoint"):
        load_init_checkpoint(model, tmp_path / "unpadded.safetensors")
    assert_same_weights(model, source)
    assert "trained with another hidden_act: checkpoint 'relu' vs this run 'gelu'" in caplog.text


def test_a_resumed_run_ignores_the_init_checkpoint(checkpoints, caplog):
    model = fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert init_weights(model, "", None) is None
    with caplog.at_level(logging.INFO, logger="pretrain.init_checkpoint"):
        info = init_weights(model, "/nowhere/model.ckpt-28252", "20")  # not even read
    assert info == {"path": "/nowhere/model.ckpt-28252", "loaded": False, "reason": "resumed from checkpoint 20"}
    assert "ignored: resuming from this run's checkpoint 20 (its weights win)" in caplog.text
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    info = init_weights(model, str(checkpoints["safetensors"]), None)
    assert info["loaded"] is True and info["format"] == "safetensors"
    assert_same_weights(model, checkpoints["source"])


def test_train_preflight_checks_the_init_checkpoint(checkpoints, golden, tmp_path, capsys):
    """`bertpipe train` refuses a mismatching init checkpoint before any rank starts; a good one is passed on."""
    from bertpipe.cli import main

    base = ["train", "--train-dir", str(golden / "4bins"), "--model", "tiny", "--output-dir", str(tmp_path / "o"),
            "--device", "cpu", "--dry-run"]
    assert main([*base, "--init-checkpoint", str(checkpoints["hf"])]) == 0
    assert f"--init-checkpoint {checkpoints['hf']}" in capsys.readouterr().out
    assert main([*base, "--init-checkpoint", str(checkpoints["safetensors"]), "--vocab-size", "30600"]) == 2
    err = capsys.readouterr().err
    assert "bertpipe train: error: " in err and "embeddings.word_embeddings.weight has shape (30528, 64) in the " \
        "checkpoint but (30600, 64) in this run's model (vocab_size=30600" in err
    assert main([*base, "--init-checkpoint", str(tmp_path / "missing.safetensors")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --- a real run (DeepSpeed launcher, 1 CPU rank) --------------------------------------------------------------

@pytest.mark.slow
def test_training_starts_from_the_init_checkpoint_and_a_resume_ignores_it(golden, tmp_path, capfd):
    """Step 1's loss is the init model's loss on the first batch (dropout off, bf16 as DeepSpeed runs it), far
    from the random init's; the resume (with a checkpoint of another vocab as --init-checkpoint) ignores it."""
    pytest.importorskip("deepspeed")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))  # as test_train
    from bertpipe.cli import main
    from pretrain.data import BinnedSampler, discover_shards
    from pretrain.launch import launch
    from pretrain.metrics import read_metrics
    from pretrain.train_config import TrainConfig

    nodrop = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    (tmp_path / "nodrop.json").write_text(json.dumps(nodrop))
    init = perturbed_tiny(seed=11, **nodrop)
    with torch.no_grad():
        init.mlm_head.bias.add_(torch.randn_like(init.mlm_head.bias) * 2)  # a loss far from the random init's
    save_safetensors(init, tmp_path / "init.safetensors")
    out, train_dir, seed = tmp_path / "run", golden / "4bins", 12439
    argv = ["train", "--train-dir", str(train_dir), "--model", "tiny", "--model-config", str(tmp_path / "nodrop.json"),
            "--max-steps", "2", "--nproc", "1", "--device", "cpu", "--deterministic", "--micro-batch", "4",
            "--global-batch", "4", "--output-dir", str(out), "--no-tensorboard", "--seed", str(seed),
            "--init-checkpoint", str(tmp_path / "init.safetensors")]
    assert main(argv) == 0, capfd.readouterr().err[-3000:]
    losses = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}

    first = BinnedSampler(discover_shards(train_dir), 4, 0, 1, seed, init.config.vocab_size).next_batch().arrays
    tensors = {k: torch.from_numpy(v) for k, v in first.items()}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        random_init = BertForPreTraining(init.config)
    with torch.no_grad():
        want = init.bfloat16()(**tensors).loss.item()
        unwanted = random_init.bfloat16()(**tensors).loss.item()
    with capfd.disabled():
        print(f"\nstep-1 loss {losses[1]:.5f}; in-process: init model {want:.5f}, random init {unwanted:.5f}")
    assert abs(want - unwanted) > 1.0, (want, unwanted)
    assert losses[1] == pytest.approx(want, rel=2e-3), (losses[1], want, unwanted)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["init_checkpoint"] == {"path": str(tmp_path / "init.safetensors"), "format": "safetensors",
                                          "tensors": len(init.state_dict()), "loaded": True}
    assert json.loads((out / "config.json").read_text())["train"]["init_checkpoint"] == str(tmp_path / "init.safetensors")
    run_cfg = json.loads((out / "checkpoints" / "2" / "bertpipe_config.json").read_text())["run"]
    assert run_cfg["init_checkpoint"] == str(tmp_path / "init.safetensors")

    # resume: the ranks themselves (no preflight) ignore an init checkpoint that would not even fit
    save_safetensors(BertForPreTraining(model_config("tiny", vocab_size=30000)), tmp_path / "other.safetensors")
    cfg = TrainConfig(train_dir=str(train_dir), model="tiny", model_config=str(tmp_path / "nodrop.json"),
                      max_steps=3, device="cpu", deterministic=True, micro_batch=4, global_batch=4,
                      output_dir=str(out), tensorboard=False, seed=seed, resume=True,
                      init_checkpoint=str(tmp_path / "other.safetensors"))
    capfd.readouterr()
    assert launch(cfg, nproc=1, check=False) == 0
    assert "--init-checkpoint " + str(tmp_path / "other.safetensors") + " ignored: resuming from this run's " \
        "checkpoint 2 (its weights win)" in capfd.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["init_checkpoint"]["loaded"] is False
    assert summary["weights_from"] == str(tmp_path / "init.safetensors")  # carried over from the checkpoint
