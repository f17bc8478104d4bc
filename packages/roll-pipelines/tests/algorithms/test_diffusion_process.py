"""Noising process, targets and samplers, against diffusers' schedulers and hand-written references."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms.diffusion import (
    NoiseProcess,
    add_noise,
    ddim_step,
    denoising_target,
    flow_process,
    noise_process_from_scheduler,
    predicted_x0_and_noise,
    sample_ode,
    sample_training_timesteps,
    sampling_timesteps,
    vp_process,
)
from roll.runtime.errors import ConfigError

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve

diffusers = pytest.importorskip("diffusers")
TOL = {"atol": 1e-6, "rtol": 1e-6}


def _fixed(seed: int, shape=(4, 3, 8, 8)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _ddpm(prediction_type: str = "epsilon"):
    return diffusers.DDPMScheduler(num_train_timesteps=1000, prediction_type=prediction_type, clip_sample=False)


def test_vp_process_matches_ddpm_constants_and_add_noise():
    process = vp_process("epsilon")
    scheduler = _ddpm()
    assert_close(process.alphas_cumprod, scheduler.alphas_cumprod.float(), **TOL)
    # The formula, with the scheduler's own constants (ours accumulate in float64, diffusers' in float32).
    from_scheduler = noise_process_from_scheduler(scheduler)
    x0, noise = _fixed(0), _fixed(1)
    t = torch.tensor([0, 17, 500, 999])
    assert_close(add_noise(from_scheduler, x0, noise, t.float()), scheduler.add_noise(x0, noise, t), **TOL)


def test_v_target_matches_diffusers_velocity_and_conversions_invert():
    process = vp_process("v_prediction")
    x0, noise, t = _fixed(2), _fixed(3), torch.tensor([3.0, 250.0, 640.0, 998.0])
    assert_close(
        denoising_target(process, x0, noise, t), _ddpm("v_prediction").get_velocity(x0, noise, t.long()), **TOL
    )
    for proc in (process, vp_process("epsilon"), flow_process()):
        x_t = add_noise(proc, x0, noise, t)
        x0_hat, noise_hat = predicted_x0_and_noise(proc, denoising_target(proc, x0, noise, t), x_t, t)
        assert_close(x0_hat, x0, atol=2e-4, rtol=0)  # epsilon at t=998 divides by a ~ 0.006
        assert_close(noise_hat, noise, **TOL)


def test_flow_noise_and_target_by_hand():
    process = flow_process()
    x0, noise, t = _fixed(4), _fixed(5), torch.tensor([0.0, 250.0, 500.0, 1000.0])
    sigma = (t / 1000).reshape(-1, 1, 1, 1)
    assert_close(add_noise(process, x0, noise, t), (1 - sigma) * x0 + sigma * noise, **TOL)
    assert_close(denoising_target(process, x0, noise, t), noise - x0, **TOL)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_ddim_loop_matches_diffusers_ddim(prediction_type):
    process = vp_process(prediction_type)
    scheduler = diffusers.DDIMScheduler(
        num_train_timesteps=1000, prediction_type=prediction_type, clip_sample=False, timestep_spacing="trailing"
    )
    scheduler.set_timesteps(10)
    timesteps = sampling_timesteps(process, 10)
    assert timesteps[:-1].long().tolist() == scheduler.timesteps.tolist() and timesteps[-1] == -1
    x_ours = x_ref = _fixed(6)
    for i in range(10):
        output = torch.tanh(x_ours) * (1 + i / 10)  # any fixed function of the state
        t = timesteps[i].expand(4)
        x_ours = ddim_step(process, x_ours, output, t, timesteps[i + 1].expand(4))
        x_ref = scheduler.step(torch.tanh(x_ref) * (1 + i / 10), scheduler.timesteps[i], x_ref).prev_sample
    assert_close(x_ours, x_ref, atol=1e-5, rtol=1e-5)


def test_flow_euler_loop_matches_diffusers_flow_match_euler():
    process = flow_process()
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
    timesteps = sampling_timesteps(process, 4)
    scheduler.set_timesteps(sigmas=(timesteps[:-1] / 1000).tolist())
    assert_close(scheduler.timesteps, timesteps[:-1], **TOL)
    x_ours = x_ref = _fixed(7)
    for i in range(4):
        x_ours = ddim_step(process, x_ours, torch.sin(x_ours), timesteps[i].expand(4), timesteps[i + 1].expand(4))
        x_ref = scheduler.step(torch.sin(x_ref), scheduler.timesteps[i], x_ref).prev_sample
    assert_close(x_ours, x_ref, **TOL)


def test_sampling_and_training_timesteps():
    assert sampling_timesteps(flow_process(), 2).tolist() == [1000.0, 500.0, 0.0]
    assert sampling_timesteps(vp_process(), 1).tolist() == [999.0, -1.0]
    gen = torch.Generator().manual_seed(0)
    vp_t = sample_training_timesteps(vp_process(), 1000, generator=gen)
    assert vp_t.min() >= 0 and vp_t.max() <= 999 and torch.equal(vp_t, vp_t.round())
    flow_t = sample_training_timesteps(flow_process(), 1000, generator=gen)
    assert flow_t.min() >= 0 and flow_t.max() <= 1000 and not torch.equal(flow_t, flow_t.round())
    with pytest.raises(ConfigError, match="num_steps"):
        sampling_timesteps(flow_process(), 0)


def test_process_validation_and_scheduler_reading():
    with pytest.raises(ConfigError, match="does not fit"):
        NoiseProcess("flow", "epsilon")
    with pytest.raises(ConfigError, match="alphas_cumprod"):
        NoiseProcess("vp", "epsilon", 10)
    with pytest.raises(ConfigError, match="integers in"):
        add_noise(vp_process(), _fixed(0), _fixed(1), torch.tensor([0.0, 1.0, 2.0, 1000.0]))
    assert noise_process_from_scheduler(diffusers.FlowMatchEulerDiscreteScheduler()) == flow_process()
    process = noise_process_from_scheduler(_ddpm("v_prediction"))
    assert process.kind == "vp" and process.prediction_type == "v_prediction"
    with pytest.raises(ConfigError, match="unshifted"):
        noise_process_from_scheduler(diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0))


class _Scale(torch.nn.Module):
    """output = w * x: a one-parameter model whose sampling chain can be unrolled by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.7))
        self.calls_with_grad = 0

    def forward(self, x, t, labels):
        self.calls_with_grad += int(torch.is_grad_enabled())
        return self.w * x


def test_sample_ode_truncated_backprop_through_last_k_steps():
    process = flow_process()
    timesteps = sampling_timesteps(process, 4)  # sigmas 1, .75, .5, .25, 0
    model = _Scale()
    noise = _fixed(8, (2, 3, 4, 4))
    result = sample_ode(model, noise, None, process, timesteps, grad_steps=2, reference_fn=lambda x, t, y: 0.5 * x)
    assert model.calls_with_grad == 2 and len(result.outputs) == 2 and len(result.reference_outputs) == 2
    result.sample.sum().backward()
    # Euler: x_{k+1} = x_k (1 + (s_{k+1} - s_k) w) = x_k (1 - w/4). Only the last two factors see w.
    w = 0.7
    x2 = noise * (1 - w / 4) ** 2
    expected_grad = (x2 * 2 * (1 - w / 4) * (-1 / 4)).sum()
    assert_close(model.w.grad, expected_grad, **TOL)
    assert_close(result.sample, noise * (1 - w / 4) ** 4, **TOL)
    assert_close(result.reference_outputs[0], 0.5 * x2, **TOL)
    with pytest.raises(ConfigError, match="grad_steps"):
        sample_ode(model, noise, None, process, timesteps, grad_steps=5)


def test_sample_ode_records_trajectory():
    process = flow_process()
    result = sample_ode(
        lambda x, t, y: torch.zeros_like(x),
        _fixed(9),
        None,
        process,
        sampling_timesteps(process, 3),
        record_trajectory=True,
    )
    assert len(result.trajectory) == 4 and torch.equal(result.trajectory[0], _fixed(9))
    assert torch.equal(result.trajectory[-1], result.sample) and not result.outputs
