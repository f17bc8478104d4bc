"""Reward-FL, DMD and ODE-distillation losses and the quality measures, on fixed tensors against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms.diffusion import (
    add_noise,
    denoising_eval_loss,
    denoising_loss,
    dmd_fake_score_loss,
    dmd_generator_loss,
    flow_process,
    frechet_distance,
    image_features,
    median_bandwidth,
    mmd_rbf,
    ode_distill_loss,
    ode_student_timesteps,
    random_feature_net,
    regression_loss,
    reward_fl_loss,
    sampling_timesteps,
    vp_process,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}


def _fixed(seed: int, shape=(3, 2, 4, 4), dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_denoising_loss_targets_and_weights():
    x0, noise, output = _fixed(0), _fixed(1), _fixed(2)
    t = torch.tensor([100.0, 400.0, 900.0])
    for process, target in [
        (vp_process("epsilon"), noise),
        (flow_process(), noise - x0),
    ]:
        assert_close(denoising_loss(process, output, x0, noise, t), (output - target).pow(2).mean(), **TOL)
    vp = vp_process("v_prediction")
    a = vp.alphas_cumprod[t.long()].sqrt().reshape(-1, 1, 1, 1)
    s = (1 - vp.alphas_cumprod[t.long()]).sqrt().reshape(-1, 1, 1, 1)
    per_sample = (output - (a * noise - s * x0)).pow(2).mean(dim=(1, 2, 3))
    weights = torch.tensor([1.0, 0.0, 3.0])
    expected = (per_sample * weights).sum() / 4
    assert_close(denoising_loss(vp, output, x0, noise, t, weights=weights), expected, **TOL)


def test_reward_fl_loss_value_and_gradient():
    rewards = torch.tensor([0.2, 0.6, 1.0], requires_grad=True)
    outs = [_fixed(3).requires_grad_(), _fixed(4).requires_grad_()]
    refs = [_fixed(5), _fixed(6)]
    loss, metrics = reward_fl_loss(rewards, outs, refs, reward_weight=2.0, kl_coef=0.5, kl_weights=[1.0, 4.0])
    kl = ((outs[0] - refs[0]).pow(2).mean() + 4.0 * (outs[1] - refs[1]).pow(2).mean()) / 2
    assert_close(loss, -2.0 * rewards.mean() + 0.5 * kl, **TOL)
    assert metrics["reward"] == pytest.approx(0.6) and metrics["kl"] == pytest.approx(kl.item(), rel=1e-6)
    loss.backward()
    assert_close(rewards.grad, torch.full((3,), -2.0 / 3), **TOL)
    assert_close(outs[1].grad, 0.5 * 4.0 * 2 * (outs[1] - refs[1]).detach() / outs[1].numel() / 2, **TOL)
    with pytest.raises(ConfigError, match="reference outputs"):
        reward_fl_loss(rewards, outs, refs[:1])
    with pytest.raises(ConfigError, match="kl_coef"):
        reward_fl_loss(rewards, kl_coef=0.1)


@pytest.mark.parametrize("normalize", [False, True])
def test_dmd_generator_gradient_is_fake_minus_real(normalize):
    generated = _fixed(7).requires_grad_()
    real_x0, fake_x0 = _fixed(8), _fixed(9)
    loss = dmd_generator_loss(generated, real_x0, fake_x0, normalize=normalize)
    loss.backward()
    grad = fake_x0 - real_x0
    if normalize:
        grad = grad / (generated.detach() - real_x0).abs().mean(dim=(1, 2, 3), keepdim=True)
    assert_close(generated.grad, grad / generated.numel(), **TOL)
    assert_close(loss, 0.5 * grad.pow(2).mean(), **TOL)
    with pytest.raises(ConfigError, match="one shape"):
        dmd_generator_loss(generated, real_x0[:2], fake_x0)


def test_dmd_fake_score_loss_trains_only_the_fake_model():
    process = flow_process()
    generated = _fixed(10).requires_grad_()
    noise, t = _fixed(11), torch.tensor([200.0, 500.0, 800.0])
    output = _fixed(12).requires_grad_()
    loss = dmd_fake_score_loss(process, output, generated, noise, t)
    loss.backward()
    assert generated.grad is None and output.grad is not None
    assert_close(loss, (output - (noise - generated)).pow(2).mean(), **TOL)


def test_ode_student_timesteps_are_a_subset_of_the_teachers():
    teacher = sampling_timesteps(flow_process(), 50)
    student, index = ode_student_timesteps(teacher, 4)
    assert index.tolist() == [0, 12, 25, 38, 50]
    assert torch.equal(student, teacher[index])
    assert ode_student_timesteps(teacher, 50)[1].tolist() == list(range(51))
    with pytest.raises(ConfigError, match="student_steps"):
        ode_student_timesteps(teacher, 51)


def test_ode_distill_loss_is_mse_of_the_euler_step():
    process = flow_process()
    x_t, output, target = _fixed(13), _fixed(14), _fixed(15)
    t, t_next = torch.full((3,), 760.0), torch.full((3,), 500.0)
    expected = (x_t + (0.5 - 0.76) * output - target).pow(2).mean()
    assert_close(ode_distill_loss(process, output, x_t, t, t_next, target), expected, **TOL)
    assert_close(regression_loss(output, target), (output - target).pow(2).mean(), **TOL)


def test_mmd_matches_a_loop_reference():
    x, y = _fixed(16, (5, 3), torch.float64), _fixed(17, (4, 3), torch.float64) + 0.5

    def k(a, b):
        d2 = float(((a - b) ** 2).sum())
        return sum(np.exp(-d2 / (2 * (c * 1.3) ** 2)) for c in (0.5, 1.0, 2.0))

    xx = sum(k(x[i], x[j]) for i in range(5) for j in range(5) if i != j) / 20
    yy = sum(k(y[i], y[j]) for i in range(4) for j in range(4) if i != j) / 12
    xy = sum(k(x[i], y[j]) for i in range(5) for j in range(4)) / 20
    assert mmd_rbf(x, y, 1.3) == pytest.approx(xx + yy - 2 * xy, abs=1e-9)
    with pytest.raises(ConfigError, match="bandwidth"):
        mmd_rbf(x, y, 0.0)


def test_frechet_distance_matches_a_numpy_reference():
    x = _fixed(18, (40, 4), torch.float64)
    y = _fixed(19, (30, 4), torch.float64) @ torch.diag(torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=torch.float64)) + 0.3
    xn, yn = x.numpy(), y.numpy()
    cx, cy = np.cov(xn, rowvar=False), np.cov(yn, rowvar=False)
    # tr(sqrt(Cx Cy)) = sum of square roots of the (real, non-negative) eigenvalues of Cx Cy
    cross = np.sqrt(np.clip(np.linalg.eigvals(cx @ cy).real, 0, None)).sum()
    expected = ((xn.mean(0) - yn.mean(0)) ** 2).sum() + np.trace(cx) + np.trace(cy) - 2 * cross
    assert frechet_distance(x, y) == pytest.approx(expected, abs=1e-8)
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)


def test_feature_net_is_fixed_by_seed_and_separates_distributions():
    images = torch.tanh(_fixed(20, (64, 3, 16, 16)))
    a, b = image_features(random_feature_net(0), images), image_features(random_feature_net(0), images)
    assert torch.equal(a, b) and a.shape == (64, 64 + 64 * 4)
    assert not torch.equal(a, image_features(random_feature_net(1), images))
    shifted = image_features(random_feature_net(0), (images + 0.5).clamp(-1, 1))
    same = image_features(random_feature_net(0), torch.tanh(_fixed(21, (64, 3, 16, 16))))
    bandwidth = median_bandwidth(a)
    assert mmd_rbf(a, shifted, bandwidth) > 10 * abs(mmd_rbf(a, same, bandwidth))
    assert frechet_distance(a, shifted) > 5 * frechet_distance(a, same)


def test_denoising_eval_loss_is_deterministic_and_per_level():
    process = flow_process()
    images = torch.tanh(_fixed(22, (6, 3, 8, 8)))
    model = lambda x, t, y: torch.zeros_like(x)  # noqa: E731 - predicts zero velocity
    first = denoising_eval_loss(model, images, None, process, num_levels=4, seed=3, batch_size=4)
    assert first == denoising_eval_loss(model, images, None, process, num_levels=4, seed=3, batch_size=6)
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(3))
    assert first["loss"] == pytest.approx((noise - images).pow(2).mean().item(), rel=1e-6)
    assert sorted(first) == ["loss", "loss@0.125", "loss@0.375", "loss@0.625", "loss@0.875"]
    # a model that predicts the true velocity scores zero
    exact = lambda x, t, y: noise - images  # noqa: E731
    assert denoising_eval_loss(exact, images, None, process, num_levels=4, seed=3)["loss"] == pytest.approx(0.0)
    assert add_noise(process, images, noise, torch.zeros(6)).equal(images)
