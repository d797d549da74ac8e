"""A checkpoint's CUDA RNG state is its training device's alone, so a run saved with eight GPUs
visible resumes with one; older checkpoints (one state per visible GPU) still load. CUDA's RNG
calls are stood in for: no GPU here."""

import torch

from flatlm.train.state import capture_rng, restore_rng


def fake_cuda(monkeypatch, states: dict):
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: states[device.index])
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda state, device: states.__setitem__(device.index, state))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(states.values()))


def test_only_the_training_device_s_state_is_saved_and_restored(monkeypatch):
    states = {0: torch.tensor([0], dtype=torch.uint8), 1: torch.tensor([1], dtype=torch.uint8)}
    fake_cuda(monkeypatch, states)
    rng = capture_rng(torch.device("cuda", 1))
    assert [s.tolist() for s in rng["cuda"]] == [[1]]
    saved_cpu = torch.get_rng_state()
    states[1] = torch.tensor([9], dtype=torch.uint8)
    torch.rand(3)  # the CPU generator moves on
    restore_rng(rng, torch.device("cuda", 1))
    assert states[1].tolist() == [1] and states[0].tolist() == [0]
    assert torch.equal(torch.get_rng_state(), saved_cpu)


def test_an_older_checkpoint_with_every_visible_device_s_state_restores_its_own(monkeypatch):
    states = {0: torch.tensor([7], dtype=torch.uint8)}  # one GPU visible now
    fake_cuda(monkeypatch, states)
    old = {"cpu": torch.get_rng_state(),
           "cuda": [torch.tensor([v], dtype=torch.uint8) for v in (10, 11, 12)]}
    restore_rng(old, torch.device("cuda", 0))
    assert states[0].tolist() == [10]
    restore_rng(old, torch.device("cuda", 2))  # trained on cuda:2 of three
    assert states[2].tolist() == [12]
