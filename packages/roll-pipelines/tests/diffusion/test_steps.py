"""The per-step losses the diffusion workers call, on small stand-in models with known answers."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms.diffusion import add_noise, flow_process, sample_ode, sampling_timesteps, vp_process
from roll.pipelines.diffusion import (
    dmd_fake_score_step,
    dmd_generator_step,
    ema_decay_at,
    ema_update,
    generator_sample,
    ode_distill_step,
    pretrain_batch,
    pretrain_step,
    reward_fl_step,
    teacher_trajectories,
)
from roll.runtime.errors import ConfigError

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve

TOL = {"atol": 1e-6, "rtol": 1e-6}


class ConvDenoiser(torch.nn.Module):
    """A tiny conditional 'denoiser': one conv, plus a per-class bias and a time term."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
        self.class_bias = torch.nn.Embedding(24, 3)

    def forward(self, x, t, labels):
        bias = self.class_bias(labels)[:, :, None, None] if labels is not None else 0.0
        return self.conv(x) + bias + (t / 1000).reshape(-1, 1, 1, 1) * 0.1


def _batch(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "images": torch.rand(n, 3, 8, 8, generator=g) * 2 - 1,
        "class_labels": torch.randint(0, 24, (n,), generator=g),
        "noise": torch.randn(n, 3, 8, 8, generator=g),
        "timesteps": torch.rand(n, generator=g) * 1000,
        "dmd_noise": torch.randn(n, 3, 8, 8, generator=g),
        "dmd_timesteps": torch.rand(n, generator=g) * 1000,
    }


def test_pretrain_step_is_the_denoising_loss():
    model, process, batch = ConvDenoiser(), flow_process(), _batch()
    loss, metrics = pretrain_step(model, process, batch)
    x_t = add_noise(process, batch["images"], batch["noise"], batch["timesteps"])
    expected = (
        (model(x_t, batch["timesteps"], batch["class_labels"]) - (batch["noise"] - batch["images"])).pow(2).mean()
    )
    assert_close(loss, expected, **TOL)
    assert metrics == {"loss": pytest.approx(expected.item())}
    with pytest.raises(ConfigError, match=r"lacks tensor fields \['timesteps'\]"):
        pretrain_step(model, process, {k: v for k, v in batch.items() if k != "timesteps"})


def test_reward_fl_step_backpropagates_through_the_reward_and_regularises():
    process, model, reference = flow_process(), ConvDenoiser(0), ConvDenoiser(1)
    batch = _batch()
    reward = lambda images, labels: images.mean(dim=(1, 2, 3))  # noqa: E731
    loss, metrics = reward_fl_step(model, reference, reward, process, batch, num_steps=4, grad_steps=2, kl_coef=0.5)
    loss.backward()
    assert model.conv.weight.grad.abs().sum() > 0 and reference.conv.weight.grad is None
    # by hand: the same sampler, the reward of the clamped sample and the regulariser at the last two steps
    result = sample_ode(
        model,
        batch["noise"],
        batch["class_labels"],
        process,
        sampling_timesteps(process, 4),
        grad_steps=2,
        reference_fn=reference,
    )
    kl = sum((o - r).pow(2).mean() for o, r in zip(result.outputs, result.reference_outputs)) / 2
    expected = -result.sample.clamp(-1, 1).mean() + 0.5 * kl
    assert metrics["loss"] == pytest.approx(expected.item(), rel=1e-6)
    _, no_kl = reward_fl_step(model, None, reward, process, batch, num_steps=4, grad_steps=1, kl_coef=0.0)
    assert no_kl["kl"] == 0.0


def test_dmd_generator_step_vanishes_when_fake_equals_real_and_adds_regression():
    process, generator, teacher = flow_process(), ConvDenoiser(0), ConvDenoiser(1)
    batch = _batch()
    loss, metrics, generated = dmd_generator_step(generator, teacher, teacher, process, batch)
    loss.backward()
    assert loss.item() == 0.0 and generator.conv.weight.grad.abs().sum() == 0
    assert generated.shape == batch["noise"].shape and not generated.requires_grad
    # one step from pure noise (sigma = 1): x0 = noise - v
    t1 = torch.full((4,), 1000.0)
    assert_close(generated, batch["noise"] - generator(batch["noise"], t1, batch["class_labels"]).detach(), **TOL)
    target = torch.zeros_like(batch["noise"])
    batch.update(reg_noise=batch["noise"], reg_labels=batch["class_labels"], reg_target=target)
    loss, metrics, _ = dmd_generator_step(generator, teacher, teacher, process, batch, regression_weight=0.5)
    assert metrics["regression_loss"] == pytest.approx(generated.pow(2).mean().item(), rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * metrics["regression_loss"], rel=1e-6)
    fake_loss, fake_metrics = dmd_fake_score_step(
        teacher, process, generated, batch["class_labels"], batch["dmd_noise"], batch["dmd_timesteps"]
    )
    assert fake_metrics["fake_score_loss"] == pytest.approx(fake_loss.item())


def test_dmd_generator_moves_samples_towards_the_real_prediction():
    process, batch = flow_process(), _batch()
    real = lambda x, t, y: torch.zeros_like(x)  # noqa: E731 - real x0 prediction = x_t
    fake = lambda x, t, y: -torch.ones_like(x)  # noqa: E731 - fake x0 prediction = x_t + sigma
    generator = ConvDenoiser(0)
    loss, _, _ = dmd_generator_step(generator, real, fake, process, batch)
    grad = torch.autograd.grad(loss, generator.conv.bias)[0]
    # the gradient on the samples is +(fake_x0 - real_x0) > 0, i.e. descending it lowers x0 = noise - v, which
    # raises the predicted velocity v and so the conv bias
    assert (grad < 0).all()


def test_teacher_trajectories_and_ode_step():
    process, teacher, batch = flow_process(), ConvDenoiser(1), _batch(6)
    states, student_t = teacher_trajectories(
        teacher, process, batch["noise"], batch["class_labels"], teacher_steps=8, student_steps=4, batch_size=4
    )
    assert states.shape == (6, 5, 3, 8, 8) and student_t.tolist() == [1000.0, 750.0, 500.0, 250.0, 0.0]
    assert torch.equal(states[:, 0], batch["noise"])
    full = sample_ode(teacher, batch["noise"], batch["class_labels"], process, sampling_timesteps(process, 8))
    assert_close(states[:, -1], full.sample, **TOL)
    # a student equal to the teacher, with the teacher's own step count, reproduces each segment exactly
    same, t_same = teacher_trajectories(
        teacher, process, batch["noise"], batch["class_labels"], teacher_steps=4, student_steps=4
    )
    step_batch = {
        "x_t": same[:, 1],
        "timesteps": t_same[1].expand(6),
        "next_timesteps": t_same[2].expand(6),
        "target_next": same[:, 2],
        "class_labels": batch["class_labels"],
    }
    loss, _ = ode_distill_step(teacher, process, step_batch)
    assert loss.item() < 1e-12


def test_vp_one_step_generation_uses_the_trailing_first_timestep():
    process, batch = vp_process("v_prediction"), _batch()
    _, _, generated = dmd_generator_step(ConvDenoiser(0), ConvDenoiser(1), ConvDenoiser(1), process, batch)
    assert torch.isfinite(generated).all()


def test_ema_update():
    target, source = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = 0.9 * target.weight.detach() + 0.1 * source.weight.detach()
    ema_update(target, source, 0.9)
    assert_close(target.weight.detach(), expected, **TOL)


def test_ode_segment_batch_pairs_each_start_with_the_next_boundary():
    from roll.pipelines.diffusion import ode_segment_batch

    states = torch.arange(3 * 3 * 2, dtype=torch.float32).view(3, 3, 2)  # 3 trajectories, 2 segments, 2 values
    labels, timesteps = torch.tensor([7, 8, 9]), torch.tensor([1.0, 0.5, 0.0])
    batch = ode_segment_batch(states, labels, timesteps, torch.tensor([2, 0]), torch.tensor([1, 0]))
    assert batch["x_t"].tolist() == [[14.0, 15.0], [0.0, 1.0]]
    assert batch["target_next"].tolist() == [[16.0, 17.0], [2.0, 3.0]]
    assert batch["timesteps"].tolist() == [0.5, 1.0] and batch["next_timesteps"].tolist() == [0.0, 0.5]
    assert batch["class_labels"].tolist() == [9, 7]


@pytest.mark.parametrize("process", [flow_process(), vp_process()], ids=["flow", "vp"])
@pytest.mark.parametrize("steps", [2, 4])
def test_few_step_generator_samples_over_fixed_timesteps_with_gradients_through_the_last(process, steps):
    model, batch = ConvDenoiser(), _batch(n=5)
    noise, labels = batch["noise"], batch["class_labels"]
    images = generator_sample(model, process, noise, labels, steps)
    assert images.shape == noise.shape and images.requires_grad
    # the same images as the deterministic sampler over `steps` fixed timesteps (what evaluation draws)
    with torch.no_grad():
        reference = sample_ode(model, noise, labels, process, sampling_timesteps(process, steps)).sample
    assert_close(images.detach(), reference, **TOL)
    # gradients through the last step only: a constant model before it would give the same gradient
    calls = []
    counting = lambda x, t, y: calls.append(torch.is_grad_enabled()) or model(x, t, y)  # noqa: E731
    generator_sample(counting, process, noise, labels, steps).pow(2).mean().backward()
    assert calls == [False] * (steps - 1) + [True]
    assert model.conv.weight.grad is not None and model.conv.weight.grad.abs().sum() > 0
    # the DMD step takes the same path; its loss and regression term are scalars
    model.zero_grad()
    real = lambda x, t, y: x * 0.5  # noqa: E731
    fake = lambda x, t, y: x * 0.4  # noqa: E731
    reg = {"reg_noise": noise[:3], "reg_labels": labels[:3], "reg_target": torch.zeros(3, 3, 8, 8)}
    loss, metrics, generated = dmd_generator_step(
        model, real, fake, process, {**batch, **reg}, regression_weight=0.5, student_steps=steps
    )
    assert loss.ndim == 0 and set(metrics) == {"dmd_loss", "regression_loss", "loss"}
    assert generated.shape == noise.shape and not generated.requires_grad
    assert_close(generated, reference, **TOL)


def test_one_step_generator_is_the_clean_prediction_from_noise():
    model, process, batch = ConvDenoiser(), flow_process(), _batch()
    t = sampling_timesteps(process, 1)[0].expand(4)
    expected = batch["noise"] - t.reshape(-1, 1, 1, 1) / 1000 * model(batch["noise"], t, batch["class_labels"])
    assert_close(generator_sample(model, process, batch["noise"], batch["class_labels"]), expected, **TOL)


def test_pretrain_batch_draws_rows_noise_and_timesteps_in_a_fixed_order():
    images, labels = torch.arange(10.0).reshape(10, 1, 1, 1).expand(10, 3, 2, 2), torch.arange(10)
    batch = pretrain_batch(images, labels, flow_process(), 6, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    index = torch.randint(0, 10, (6,), generator=g)
    assert torch.equal(batch["class_labels"], index) and torch.equal(batch["images"], images[index])
    assert torch.equal(batch["noise"], torch.randn(6, 3, 2, 2, generator=g))
    assert torch.equal(batch["timesteps"], torch.rand(6, generator=g) * 1000)
    assert [ema_decay_at(u, 0.999) for u in (0, 1, 8990)] == [0.1, 2 / 11, 0.999]
