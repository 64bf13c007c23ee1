"""The runner's transformers (vit, mixer): their configs, their architecture, and a masked run that prunes every
kernel of theirs and counts it in the run's report."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import keras

import prune
from experiments.axis_registry import ConfigError
from experiments.config import (DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, ScheduleConfig,
                                TrainingConfig, config_hash)
from experiments.models import build, initial_weights, layer_positions


def test_transformer_configs_fill_their_defaults_so_an_explicit_default_is_the_same_run():
    vit = ModelConfig("vit")
    assert (vit.patch, vit.dim, vit.depth, vit.heads) == (7, 128, 4, 4)
    assert vit.label == "vit-p7-d128-b4-h4" and ModelConfig("mixer", dim=64).label == "mixer-p7-d64-b4"
    assert vit == ModelConfig("vit", patch=7, dim=128, depth=4, heads=4)

    def run(model):
        return RunConfig(ImplementationConfig("dense"), DatasetConfig("digits"), model, 0)

    assert config_hash(run(vit)) == config_hash(run(ModelConfig("vit", patch=7)))
    assert config_hash(run(vit)) != config_hash(run(ModelConfig("vit", patch=4)))


def test_transformer_configs_refuse_fields_they_do_not_take_and_implementations_they_do_not_run_on():
    with pytest.raises(ConfigError, match=r"patch.*only model 'vit' or 'mixer' takes patch; 'lenet5' got 4"):
        ModelConfig("lenet5", patch=4)
    with pytest.raises(ConfigError, match=r"heads.*only model 'vit' takes heads; 'mixer' got 2"):
        ModelConfig("mixer", heads=2)
    with pytest.raises(ConfigError, match=r"heads.*must divide dim 128, got 3"):
        ModelConfig("vit", heads=3)
    with pytest.raises(ConfigError, match=r"depth.*-1"):
        ModelConfig("mixer", depth=-1)
    for impl in ("sparse_tensor", "tfmot"):
        with pytest.raises(ConfigError, match=rf"implementation.*model 'vit' runs on 'dense', 'masked', not '{impl}'"):
            RunConfig(ImplementationConfig(impl), DatasetConfig("digits"), ModelConfig("vit", patch=4), 0, sparsity=0.5,
                      schedule=ScheduleConfig("one_shot", begin=0.0))


def test_vit_and_mixer_are_pre_norm_residual_blocks_over_patch_tokens():
    vit = build(ModelConfig("vit", patch=7, dim=32, depth=2, heads=4), (28, 28, 1), 10, keras)
    assert vit.get_layer("conv_0").kernel.shape == (7, 7, 1, 32) and vit.get_layer("conv_0").strides == (7, 7)
    assert vit.get_layer("positions").weights[0].shape == (16, 32)
    attn = vit.get_layer("block_1_attn")
    assert type(attn) is keras.layers.MultiHeadAttention and attn.num_heads == 4 and attn.key_dim == 8
    assert vit.get_layer("block_0_mlp_0").kernel.shape == (32, 64) and vit.get_layer("block_0_mlp_1").kernel.shape == (64, 32)
    assert {"block_0_add_0", "block_0_add_1", "block_1_add_1"} <= {layer.name for layer in vit.layers}
    mixer = build(ModelConfig("mixer", patch=4, dim=32, depth=1), (28, 28, 1), 10, keras)
    assert mixer.get_layer("block_0_token_0").kernel.shape == (49, 16)  # mixes 49 tokens through dim / 2
    assert mixer.get_layer("block_0_token_1").kernel.shape == (16, 49)
    for model in (vit, mixer):
        model.set_weights(initial_weights(model, 0))
        p = model(np.random.default_rng(0).random((3, 28, 28, 1)).astype("float32")).numpy()
        assert p.shape == (3, 10) and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)
    weights = {v.path: w for v, w in zip(vit.weights, initial_weights(vit, 0))}
    assert all((w == 0).all() for path, w in weights.items() if path.endswith("bias"))  # 2-D attention biases too
    table = weights["positions/positions"]
    assert 0.015 < table.std() < 0.025
    positions = layer_positions(vit)
    assert positions["block_0_attn/query_kernel"] == 16 and positions["block_0_mlp_0"] == 16
    assert positions["conv_0"] == 16 and positions["dense_head"] == 1
    with pytest.raises(ValueError, match=r"patch 5 must divide the image's sides 28 x 28"):
        build(ModelConfig("mixer", patch=5), (28, 28, 1), 10, keras)


def test_a_masked_vit_run_prunes_every_kernel_but_the_patch_embedding_and_its_report_counts_them(tmp_path):
    from experiments.data import load
    from experiments.implementations import train_keras3

    run = RunConfig(ImplementationConfig("masked"), DatasetConfig("digits"), ModelConfig("vit", patch=4, dim=16, depth=1,
                    heads=2), 0, training=TrainingConfig(epochs=2, batch_size=64, learning_rate=0.003), sparsity=0.75,
                    schedule=ScheduleConfig("one_shot", begin=0.0))
    out = train_keras3(run, load(run.dataset), tmp_path, lambda line: None)
    kernels = out["kernels"]
    assert {"block_0_attn/query_kernel", "block_0_attn/output_kernel", "block_0_mlp_0", "conv_0", "dense_head"} <= set(kernels)
    for name, k in kernels.items():
        want = 0.0 if name == "conv_0" else 0.75  # the patch embedding is the model's keep_dense
        assert abs(np.mean(k == 0.0) - want) < 0.02, (name, np.mean(k == 0.0))
    report = out["report"]
    assert len(report) == len(kernels) == 8  # conv_0, 4 attention kernels, 2 MLP, head
    assert out["final"]["train_accuracy"] > 0.3, out["final"]  # it learns (chance is 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", prune.PruningWarning)  # the position table is declared dense: no warning
        prune.prune_low_magnitude(build(run.model, (8, 8, 1), 10, keras))
