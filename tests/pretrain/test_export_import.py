"""Export to transformers and import of TF1 checkpoints give the same MLM and NSP logits as our model."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from pretrain.config import model_config  # noqa: E402
from pretrain.model import BertForPreTraining  # noqa: E402

ATOL = 2e-5  # fp32; observed differences are ~1e-6


def perturbed_tiny(seed: int = 0, **overrides) -> BertForPreTraining:
    """Tiny model with every tensor (biases, LayerNorms too) randomised, so a mis-mapped tensor shows."""
    torch.manual_seed(seed)
    model = BertForPreTraining(model_config("tiny", **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batch(seq: int = 96) -> dict:
    g = torch.Generator().manual_seed(7)
    lengths = [96, 40, 71]
    ids = torch.randint(1000, 30522, (3, seq), generator=g)
    mask = torch.zeros(3, seq, dtype=torch.long)
    seg = torch.zeros(3, seq, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        seg[r, n // 2: n] = 1
        ids[r, n:] = 0
    pos = torch.tensor([[1, 5, 17, 60, 95], [3, 9, 30, 0, 0], [2, 44, 70, 0, 0]])
    lab = torch.randint(0, 30522, pos.shape, generator=g) * (pos != 0)
    return dict(input_ids=ids, segment_ids=seg, input_mask=mask, masked_lm_positions=pos, masked_lm_ids=lab,
                next_sentence_labels=torch.tensor([0, 1, 1]))


def test_hf_export_gives_same_logits_and_loss(tmp_path):
    transformers = pytest.importorskip("transformers")
    from pretrain.hf_export import CONFIG_NAME, export_to_hf

    ours = perturbed_tiny()
    export_to_hf(ours, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 30522
    assert json.loads((tmp_path / "hf" / CONFIG_NAME).read_text())["hidden_size"] == 64
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    b = batch()
    valid = b["masked_lm_positions"] != 0
    labels = torch.full_like(b["input_ids"], -100)
    labels.scatter_(1, b["masked_lm_positions"], torch.where(valid, b["masked_lm_ids"], -100))
    labels[:, 0] = -100  # the scatter of the unused slots wrote to position 0 ([CLS])
    with torch.no_grad():
        out = ours(**b)
        ref = hf(input_ids=b["input_ids"], token_type_ids=b["segment_ids"], attention_mask=b["input_mask"],
                 labels=labels, next_sentence_label=b["next_sentence_labels"])
    rows = torch.arange(3)[:, None].expand_as(valid)[valid]
    ref_mlm = ref.prediction_logits[rows, b["masked_lm_positions"][valid]]
    torch.testing.assert_close(out.mlm_logits, ref_mlm, rtol=0, atol=ATOL)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=ATOL)


def test_hf_state_dict_round_trip_and_refusals():
    from pretrain.hf_export import export_to_hf, from_hf_state_dict, to_hf_state_dict

    model = perturbed_tiny()
    cfg = model.config
    back = from_hf_state_dict(to_hf_state_dict(model.state_dict(), cfg), cfg)
    own = model.state_dict()
    own["embeddings.word_embeddings.weight"][cfg.vocab_size:] = 0  # padding rows are not exported
    own["mlm_head.bias"][cfg.vocab_size:] = 0
    assert back.keys() == own.keys()
    assert all(torch.equal(back[k], own[k]) for k in own)
    wrapped = {f"module.{k}": v for k, v in model.state_dict().items()}  # DeepSpeed's names
    assert to_hf_state_dict(wrapped, cfg).keys() == to_hf_state_dict(own, cfg).keys()
    with pytest.raises(ValueError, match="layer_norm_large_model"):
        export_to_hf(perturbed_tiny(layer_norm_large_model=True), "unused")


# --- TF1 checkpoint import -------------------------------------------------------------------------------

def tf1_variables_from_hf_names(hf_state: dict) -> dict:
    """TF1 (Google/MLPerf) variables built independently of pretrain/tf_import.py, from transformers' names:
    dense kernels are [in, out] (transposed), LayerNorm weight/bias are gamma/beta, NSP weights stay [2, H]."""
    out = {}
    for name, t in hf_state.items():
        if name.startswith("cls.predictions.decoder"):
            continue  # tied to the word embeddings / output bias
        a = t.numpy()
        tf_name = name.replace("bert.encoder.layer.", "bert/encoder/layer_").replace(".", "/")
        tf_name = tf_name.replace("LayerNorm/weight", "LayerNorm/gamma").replace("LayerNorm/bias", "LayerNorm/beta")
        if tf_name == "cls/predictions/bias":
            tf_name = "cls/predictions/output_bias"
        elif tf_name.startswith("cls/seq_relationship/"):
            tf_name = tf_name.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
        elif tf_name.endswith("/weight") and "embeddings" in tf_name:
            tf_name = tf_name[: -len("/weight")]
        elif tf_name.endswith("/weight"):
            tf_name, a = tf_name[: -len("/weight")] + "/kernel", a.T.copy()
        out[tf_name] = a
    return out


@pytest.fixture(scope="module")
def tf1_checkpoint(tmp_path_factory):
    """A TF1 checkpoint written by TensorFlow's v1 Saver (plus adam slots and global_step, as MLPerf's has)."""
    tf = pytest.importorskip("tensorflow")
    from pretrain.hf_export import to_hf_state_dict

    model = perturbed_tiny(seed=1)
    variables = tf1_variables_from_hf_names(to_hf_state_dict(model.state_dict(), model.config))
    assert "bert/encoder/layer_1/attention/self/query/kernel" in variables
    assert variables["cls/seq_relationship/output_weights"].shape == (2, 64)
    prefix = tmp_path_factory.mktemp("tf1") / "model.ckpt-28252"
    graph = tf.Graph()
    with graph.as_default():
        for name, value in variables.items():
            tf.compat.v1.Variable(value, name=name)
            tf.compat.v1.Variable(value * 0, name=f"{name}/adam_m")
        tf.compat.v1.Variable(28252, name="global_step", dtype=tf.int64)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(prefix), write_meta_graph=False)
    return model, prefix


def test_tf1_checkpoint_import_gives_same_logits(tf1_checkpoint):
    from pretrain.tf_import import load_tf_checkpoint, read_tf_checkpoint

    source, prefix = tf1_checkpoint
    names = read_tf_checkpoint(prefix)
    assert "bert/embeddings/word_embeddings" in names and "global_step" in names
    target = perturbed_tiny(seed=2)
    b = batch()
    with torch.no_grad():
        assert not torch.allclose(target(**b).nsp_logits, source(**b).nsp_logits)
        counts = load_tf_checkpoint(target, prefix)
        got, want = target(**b), source(**b)
    assert counts["ignored"] == len(names) // 2 + 1  # every adam_m slot and global_step
    torch.testing.assert_close(got.mlm_logits, want.mlm_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(got.nsp_logits, want.nsp_logits, rtol=0, atol=ATOL)


def test_tf1_checkpoint_from_another_config_is_refused(tf1_checkpoint, tmp_path):
    from pretrain.tf_import import load_tf_checkpoint

    _, prefix = tf1_checkpoint
    with pytest.raises(ValueError, match="another config"):
        load_tf_checkpoint(BertForPreTraining(model_config("tiny", intermediate_size=128)), prefix)
    with pytest.raises(ValueError, match="layer_2"):
        load_tf_checkpoint(BertForPreTraining(model_config("tiny", num_hidden_layers=3)), prefix)
    with pytest.raises(ValueError, match="vocab_size=30000"):
        load_tf_checkpoint(BertForPreTraining(model_config("tiny", vocab_size=30000)), prefix)
    with pytest.raises(ValueError, match="does not exist"):
        load_tf_checkpoint(BertForPreTraining(model_config("tiny")), tmp_path / "missing.ckpt")


def fake_vocab(path, n: int = 30522):
    """A vocab.txt of n entries with BERT's special tokens where MLPerf's vocab has them ([CLS]=101...)."""
    special = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{special.get(i, f'tok{i}')}\n" for i in range(n)), encoding="utf-8")
    return path


def write_training_checkpoint(run, model: BertForPreTraining, tag: str = "40", latest: bool = True,
                              vocab="fake") -> dict:
    """OUTPUT_DIR/checkpoints/<tag>/ as pretrain/train.py writes it (DeepSpeed's bf16 module weights + our
    config, with the vocab record of ``vocab``: a fake vocab.txt beside the run by default, None for no
    record); returns the bf16 state dict."""
    from pretrain import checkpoint as ckpt
    from pretrain.vocab_file import vocab_record

    d = ckpt.checkpoint_dir(run) / tag
    d.mkdir(parents=True)
    bf16 = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    torch.save({"module": bf16, "ds_version": "0.19.8", "global_steps": int(tag)}, d / "mp_rank_00_model_states.pt")
    if vocab == "fake":
        vocab = fake_vocab(run.parent / f"{run.name}-vocab.txt", model.config.vocab_size)
    record = vocab_record(vocab)
    (d / ckpt.CONFIG_NAME).write_text(json.dumps({"model": model.config.to_dict(),
                                                  "run": {"vocab": record} if record else {}}))
    if latest:
        (d.parent / "latest").write_text(tag)
    return bf16


def test_export_from_a_training_checkpoint(tmp_path):
    """A checkpoint laid out as pretrain/train.py writes it (DeepSpeed bf16 module weights) exports and loads."""
    transformers = pytest.importorskip("transformers")
    from pretrain.hf_export import main

    model = perturbed_tiny()
    bf16 = write_training_checkpoint(tmp_path / "run", model)
    assert main([str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    model.load_state_dict({k: v.float() for k, v in bf16.items()})
    b = batch()
    with torch.no_grad():
        want = model(**b).nsp_logits
        got = hf(input_ids=b["input_ids"], token_type_ids=b["segment_ids"], attention_mask=b["input_mask"])
    torch.testing.assert_close(got.seq_relationship_logits, want, rtol=0, atol=ATOL)
    assert main([str(tmp_path / "nothing"), str(tmp_path / "hf2")]) == 2


def test_tf_import_command_writes_safetensors_and_hf(tf1_checkpoint, tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from pretrain.tf_import import main

    source, prefix = tf1_checkpoint
    cfg_path = tmp_path / "bert_config.json"
    cfg_path.write_text(json.dumps(source.config.to_dict()))
    out = tmp_path / "init.safetensors"
    vocab = fake_vocab(tmp_path / "vocab.txt")
    assert main([str(prefix), "--config", str(cfg_path), "--out-safetensors", str(out),
                 "--out-hf", str(tmp_path / "hf"), "--vocab", str(vocab)]) == 0
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == vocab.read_bytes()
    target = BertForPreTraining(source.config).eval()
    target.load_state_dict(load_file(out))
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    b = batch()
    with torch.no_grad():
        want = source(**b).nsp_logits
        torch.testing.assert_close(target(**b).nsp_logits, want, rtol=0, atol=ATOL)
        got = hf(input_ids=b["input_ids"], token_type_ids=b["segment_ids"], attention_mask=b["input_mask"])
    torch.testing.assert_close(got.seq_relationship_logits, want, rtol=0, atol=ATOL)
    assert main([str(tmp_path / "missing"), "--out-hf", str(tmp_path / "x"), "--vocab", str(vocab)]) == 2
    assert main([str(prefix), "--out-hf", str(tmp_path / "x")]) == 2  # no --vocab: refused
    assert not (tmp_path / "x").exists()


# --- the commands: bertpipe export-hf / import-tf ------------------------------------------------------------

def hf_logits(hf, b: dict) -> tuple:
    """transformers' MLM logits at our masked positions (the valid slots) and NSP logits."""
    with torch.no_grad():
        ref = hf(input_ids=b["input_ids"], token_type_ids=b["segment_ids"], attention_mask=b["input_mask"])
    valid = b["masked_lm_positions"] != 0
    rows = torch.arange(len(valid))[:, None].expand_as(valid)[valid]
    return ref.prediction_logits[rows, b["masked_lm_positions"][valid]], ref.seq_relationship_logits


def cli_error(capsys, argv: list[str]) -> str:
    """Run `bertpipe ARGV`, which must fail with exit status 2 and one line on stderr; return that line."""
    from bertpipe.cli import main

    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bertpipe {argv[0]}: error: ") and "\n" not in err, err
    return err


def test_cli_export_hf_gives_transformers_the_same_logits(tmp_path, capsys):
    """`bertpipe export-hf` of a training run's checkpoint: the newest one, or the one --tag names."""
    transformers = pytest.importorskip("transformers")
    from bertpipe.cli import main

    run = tmp_path / "run"
    older, newer = perturbed_tiny(seed=3), perturbed_tiny(seed=4)
    states = {"20": write_training_checkpoint(run, older, "20", latest=False),
              "40": write_training_checkpoint(run, newer, "40")}
    assert main(["export-hf", str(run), str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "hf")
    assert main(["export-hf", str(run), str(tmp_path / "hf20"), "--tag", "20"]) == 0
    b = batch()
    for tag, hf_dir in (("40", "hf"), ("20", "hf20")):
        ours = BertForPreTraining(newer.config).eval()
        ours.load_state_dict({k: v.float() for k, v in states[tag].items()})  # what training saved (bf16)
        hf = transformers.BertForPreTraining.from_pretrained(tmp_path / hf_dir).eval()
        with torch.no_grad():
            want = ours(**b)
        mlm, nsp = hf_logits(hf, b)
        torch.testing.assert_close(mlm, want.mlm_logits, rtol=0, atol=ATOL)
        torch.testing.assert_close(nsp, want.nsp_logits, rtol=0, atol=ATOL)
    with torch.no_grad():  # the two checkpoints differ: the tag was honoured
        assert not torch.allclose(hf_logits(hf, b)[1], hf_logits(
            transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval(), b)[1])

    x = str(tmp_path / "x")
    assert "no such training run folder" in cli_error(capsys, ["export-hf", str(tmp_path / "nothing"), x])
    assert "has no checkpoint '99'; there are: 20, 40" in cli_error(capsys, ["export-hf", str(run), x, "--tag", "99"])
    (run / "checkpoints" / "latest").unlink()
    assert "no 'latest' file; pass --tag, one of 20, 40" in cli_error(capsys, ["export-hf", str(run), x])
    (run / "checkpoints" / "20" / "mp_rank_00_model_states.pt").unlink()
    assert "not a complete bertpipe training checkpoint" in cli_error(capsys, ["export-hf", str(run), x, "--tag", "20"])
    assert not (tmp_path / "x").exists()


def our_top_prediction(model: BertForPreTraining, input_ids: list[int], mask_id: int = 103) -> int:
    """Our model's most likely token at the (one) [MASK] of ``input_ids``."""
    ids = torch.tensor([input_ids])
    pos = torch.tensor([[input_ids.index(mask_id)]])
    with torch.no_grad():
        out = model.eval()(input_ids=ids, segment_ids=torch.zeros_like(ids), input_mask=torch.ones_like(ids),
                           masked_lm_positions=pos, masked_lm_ids=torch.zeros_like(pos),
                           next_sentence_labels=torch.tensor([0]))
    return int(out.mlm_logits[0].argmax())


def fill_mask_matches_ours(hf_dir, model: BertForPreTraining, text: str, cls_id: int = 101) -> dict:
    """transformers' fill-mask pipeline over HF_DIR: its tokenizer gives the data vocab's ids and its top
    prediction is our model's on the same ids; returns the pipeline's top result."""
    transformers = pytest.importorskip("transformers")
    fill = transformers.pipeline("fill-mask", model=str(hf_dir))
    ids = fill.tokenizer(text)["input_ids"]
    assert ids[0] == cls_id and fill.tokenizer.cls_token_id == cls_id and ids[-1] == fill.tokenizer.sep_token_id
    assert fill.tokenizer.unk_token_id not in ids, fill.tokenizer.convert_ids_to_tokens(ids)  # no word lost to [UNK]
    top = fill(text, top_k=1)[0]
    assert top["token"] == our_top_prediction(model, ids, fill.tokenizer.mask_token_id)
    assert top["token_str"] == fill.tokenizer.convert_ids_to_tokens(top["token"])
    return top


def test_cli_export_hf_writes_the_tokenizer_of_the_recorded_vocab(tmp_path, capsys, shared_data):
    """The run's recorded vocab (MLPerf's) becomes a BertTokenizer(Fast) set; fill-mask predicts as ours."""
    transformers = pytest.importorskip("transformers")
    from bertpipe.cli import main

    vocab = tmp_path / "data" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_bytes((shared_data / "vocab.txt").read_bytes())
    model = perturbed_tiny(seed=11)
    bf16 = write_training_checkpoint(tmp_path / "run", model, vocab=vocab)
    model.load_state_dict({k: v.float() for k, v in bf16.items()})  # what training saved
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    hf = tmp_path / "hf"
    assert (hf / "vocab.txt").read_bytes() == vocab.read_bytes()
    assert json.loads((hf / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert json.loads((hf / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"
    for cls in (transformers.BertTokenizer, transformers.BertTokenizerFast, transformers.AutoTokenizer):
        tok = cls.from_pretrained(hf)
        assert (tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.pad_token_id, len(tok)) == (
            101, 102, 103, 0, 30522)
        assert tok("The Quick")["input_ids"] == [101, 1996, 4248, 102]  # lower-cased, MLPerf's ids
    top = fill_mask_matches_ours(hf, model, "The capital of France is [MASK] .")
    assert top["token_str"]

    # no record: refused naming the flag; --vocab supplies it
    model2 = perturbed_tiny(seed=12)
    write_training_checkpoint(tmp_path / "norec", model2, vocab=None)
    err = cli_error(capsys, ["export-hf", str(tmp_path / "norec"), str(tmp_path / "x")])
    assert "records no vocab" in err and "pass --vocab FILE" in err
    assert main(["export-hf", str(tmp_path / "norec"), str(tmp_path / "hf2"), "--vocab", str(vocab)]) == 0
    assert (tmp_path / "hf2" / "vocab.txt").read_bytes() == vocab.read_bytes()
    # a --vocab other than the recorded one
    other = fake_vocab(tmp_path / "other.txt")
    err = cli_error(capsys, ["export-hf", str(tmp_path / "run"), str(tmp_path / "x"), "--vocab", str(other)])
    assert "is not the vocab run" in err and str(vocab.resolve()) in err
    # the recorded file changed, then gone
    vocab.write_bytes(vocab.read_bytes() + b"extra\n")
    err = cli_error(capsys, ["export-hf", str(tmp_path / "run"), str(tmp_path / "x")])
    assert "has changed since run" in err and "pass --vocab FILE" in err
    vocab.unlink()
    err = cli_error(capsys, ["export-hf", str(tmp_path / "run"), str(tmp_path / "x")])
    assert "is missing; pass --vocab FILE" in err
    assert not (tmp_path / "x").exists()
    # a vocab larger than the model's embedding
    small = perturbed_tiny(seed=13, vocab_size=2000)
    write_training_checkpoint(tmp_path / "small", small, vocab=None)
    err = cli_error(capsys, ["export-hf", str(tmp_path / "small"), str(tmp_path / "x"), "--vocab", str(other)])
    assert "has 30522 entries but the model's vocab_size is 2000" in err


def test_cli_import_tf_to_safetensors_gives_identical_logits(tf1_checkpoint, tmp_path, capsys):
    """`bertpipe import-tf` of a checkpoint TensorFlow wrote: the safetensors loads into our model as is."""
    from safetensors.torch import load_file

    from bertpipe.cli import main

    source, prefix = tf1_checkpoint
    cfg_path = tmp_path / "bert_config.json"
    cfg_path.write_text(json.dumps(source.config.to_dict()))
    out = tmp_path / "init.safetensors"
    assert main(["import-tf", str(prefix), "--config", str(cfg_path), "--out-safetensors", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    target = BertForPreTraining(source.config).eval()
    target.load_state_dict(load_file(out))  # strict: every tensor, our names
    b = batch()
    with torch.no_grad():
        got, want = target(**b), source(**b)
    assert torch.equal(got.mlm_logits, want.mlm_logits) and torch.equal(got.nsp_logits, want.nsp_logits)
    # the directory form with a preset config gives the same file contents
    out2 = tmp_path / "dir.safetensors"
    assert main(["import-tf", str(prefix.parent), "--model", "tiny", "--out_safetensors", str(out2)]) == 0
    a, c = load_file(out), load_file(out2)
    assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)


def test_cli_import_tf_errors_are_one_line(tf1_checkpoint, tmp_path, capsys):
    source, prefix = tf1_checkpoint
    out = tmp_path / "x.safetensors"

    def config(**overrides):
        path = tmp_path / f"cfg_{'_'.join(overrides)}.json"
        path.write_text(json.dumps({**source.config.to_dict(), **overrides}))
        return ["--config", str(path)]

    cases = [
        ([str(tmp_path / "model.ckpt-1")], "TF_CHECKPOINT " + str(tmp_path / "model.ckpt-1") + ": no such checkpoint"),
        ([str(prefix), *config(intermediate_size=128)],
         "bert/encoder/layer_0/intermediate/dense/kernel has shape (64, 256) but the model expects (64, 128) "
         "(our encoder.layer.0.ffn_in.weight)"),
        ([str(prefix), *config(vocab_size=30000)],
         "bert/embeddings/word_embeddings has shape (30522, 64) but the model expects (30000, 64)"),
        ([str(prefix), "--model", "large"], "the checkpoint has 2 encoder layers"),
        ([str(prefix), "--config", str(tmp_path / "missing.json")], "missing.json: no such bert_config.json"),
    ]
    for argv, message in cases:
        assert message in cli_error(capsys, ["import-tf", *argv, "--out-safetensors", str(out)])
    assert "give --out-safetensors FILE and/or --out-hf DIR" in cli_error(capsys, ["import-tf", str(prefix)])
    vocab = fake_vocab(tmp_path / "vocab.txt")
    assert "layer_norm_large_model" in cli_error(capsys, ["import-tf", str(prefix), "--model", "1.5b", "--out-hf",
                                                          str(tmp_path / "hf"), "--vocab", str(vocab)])
    err = cli_error(capsys, ["import-tf", str(prefix), "--model", "tiny", "--out-hf", str(tmp_path / "hf")])
    assert f"--out-hf {tmp_path / 'hf'} needs --vocab FILE" in err
    bad = tmp_path / "bad_vocab.txt"
    bad.write_text("a\nb\n")
    assert "has no [UNK], [SEP], [PAD], [CLS], [MASK] entry" in cli_error(
        capsys, ["import-tf", str(prefix), "--model", "tiny", "--out-hf", str(tmp_path / "hf"), "--vocab", str(bad)])
    assert "no.txt: no such vocab.txt" in cli_error(capsys, ["import-tf", str(prefix), "--model", "tiny", "--out-hf",
                                                             str(tmp_path / "hf"), "--vocab", str(tmp_path / "no.txt")])
    assert not out.exists() and not (tmp_path / "hf").exists()


def test_cli_import_tf_to_hf_writes_the_tokenizer_and_fill_mask_gives_real_tokens(tf1_checkpoint, tmp_path, capsys,
                                                                                   shared_data):
    """import-tf --out-hf --vocab (MLPerf's vocab.txt): export-hf's tokenizer files, every file 0644, and
    transformers' fill-mask on the imported checkpoint returns real tokens, our model's prediction."""
    pytest.importorskip("transformers")
    from bertpipe.cli import main

    source, prefix = tf1_checkpoint
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes((shared_data / "vocab.txt").read_bytes())
    hf = tmp_path / "hf"
    old = os.umask(0o022)
    try:
        assert main(["import-tf", str(prefix), "--model", "tiny", "--out-hf", str(hf), "--vocab", str(vocab),
                     "--out-safetensors", str(tmp_path / "init.safetensors")]) == 0
    finally:
        os.umask(old)
    names = {p.name for p in hf.iterdir()}
    assert {"config.json", "model.safetensors", "bertpipe_config.json", "vocab.txt", "tokenizer_config.json",
            "special_tokens_map.json"} == names
    assert (hf / "vocab.txt").read_bytes() == vocab.read_bytes()
    assert json.loads((hf / "tokenizer_config.json").read_text())["do_lower_case"] is True
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in [*hf.iterdir(), tmp_path / "init.safetensors"]}
    assert set(modes.values()) == {"0o644"}, modes  # safetensors writes 0600 by itself
    for text in ("The capital of France is [MASK] .", "He went to the [MASK] yesterday ."):
        top = fill_mask_matches_ours(hf, source, text)
        assert top["token_str"].strip() and top["token_str"] not in ("[UNK]", "[PAD]"), top


def test_export_hf_files_are_0644(tmp_path):
    from pretrain.hf_export import export_to_hf, export_tokenizer

    model = perturbed_tiny(seed=3)
    old = os.umask(0o022)
    try:
        export_to_hf(model, tmp_path / "hf")
        export_tokenizer(fake_vocab(tmp_path / "vocab.txt"), tmp_path / "hf", model.config)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert len(modes) == 6 and set(modes.values()) == {0o644}, modes


# --- the vocab a run trains on: recorded, sets vocab_size, and becomes the export's tokenizer --------------

def test_vocab_sets_the_model_vocab_size_unless_given(tmp_path):
    from pretrain.train import model_config_for
    from pretrain.train_config import TrainConfig

    small = fake_vocab(tmp_path / "vocab.txt", 2056)  # the demo data's vocab size
    assert model_config_for(TrainConfig(model="tiny")).vocab_size == 30522  # the preset
    assert model_config_for(TrainConfig(model="tiny", vocab=str(small))).vocab_size == 2056
    assert model_config_for(TrainConfig(model="tiny", vocab=str(small), vocab_size=4000)).vocab_size == 4000
    cfg_json = tmp_path / "bert_config.json"
    cfg_json.write_text(json.dumps({"vocab_size": 3000}))
    assert model_config_for(TrainConfig(model="tiny", vocab=str(small), model_config=str(cfg_json))).vocab_size == 3000
    with pytest.raises(ValueError, match=r"--vocab .*missing.txt: cannot read it"):
        model_config_for(TrainConfig(model="tiny", vocab=str(tmp_path / "missing.txt")))


def test_bertpipe_train_takes_a_work_dirs_bins_eval_and_vocab(tmp_path, capsys, shared_data):
    """--train-dir naming a data work dir (last_run.json) stands for its bins, eval file and vocab."""
    import shutil

    from bertpipe.cli import main

    golden = shared_data / "golden"
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)  # a summary's outputs must lie inside its work dir (else it is ignored)
    shutil.copytree(golden / "4bins", work / "data" / "4bins")
    shutil.copy(golden / "eval_100.hdf5", work / "data")
    shutil.copy(shared_data / "vocab.txt", work / "data")
    outputs = {"train_dir": str(work / "data" / "4bins"), "eval_hdf5": str(work / "data" / "eval_100.hdf5"),
               "vocab": str(work / "data" / "vocab.txt")}
    (work / "last_run.json").write_text(json.dumps({"stages": {}, "outputs": outputs}))
    assert main(["train", "--train-dir", str(work), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    cmd = capsys.readouterr().out.strip().splitlines()[-1]
    for flag, value in (("--train-dir", "train_dir"), ("--eval-file", "eval_hdf5"), ("--vocab", "vocab")):
        assert f"{flag} {outputs[value]}" in cmd, cmd
    other = fake_vocab(tmp_path / "other.txt")  # an explicit --vocab wins
    assert main(["train", "--train-dir", str(work), "--output-dir", str(tmp_path / "out"), "--vocab", str(other),
                 "--dry-run"]) == 0
    assert f"--vocab {other}" in capsys.readouterr().out


def test_a_run_records_its_vocab(vocab_run):
    """The real 2-rank run (tests/pretrain/conftest.py) records path, md5 and entries of its --vocab."""
    import hashlib

    vocab = vocab_run.parent / "data" / "vocab.txt"
    want = {"path": str(vocab.resolve()), "md5": hashlib.md5(vocab.read_bytes()).hexdigest(), "entries": 30522}
    config = json.loads((vocab_run / "config.json").read_text())
    assert config["vocab"] == want and config["model"]["vocab_size"] == 30522
    assert json.loads((vocab_run / "summary.json").read_text())["vocab"] == want
    from pretrain import checkpoint as ckpt

    tag = ckpt.latest_tag(vocab_run)
    assert json.loads((ckpt.checkpoint_dir(vocab_run) / tag / ckpt.CONFIG_NAME).read_text())["run"]["vocab"] == want


def test_export_hf_of_a_trained_run_fills_masks_as_our_model(vocab_run, tmp_path):
    """`bertpipe export-hf` of the real run, no --vocab: MLPerf ids ([CLS]=101) and our top prediction."""
    from bertpipe.cli import main
    from pretrain.hf_export import load_training_checkpoint

    assert main(["export-hf", str(vocab_run), str(tmp_path / "hf")]) == 0
    state, config = load_training_checkpoint(vocab_run)
    ours = BertForPreTraining(config)
    ours.load_state_dict({k: v.float() for k, v in state.items()})
    for text in ("the man went to the [MASK] .", "In 1905 , [MASK] published four papers ."):
        top = fill_mask_matches_ours(tmp_path / "hf", ours, text)
        assert top["token_str"] and not top["token_str"].startswith("[unused")  # a word of the vocab
