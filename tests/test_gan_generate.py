"""generate.py's modes on tiny networks (a converted NVlabs fixture, fresh Pixelsmith StyleGAN2 and DCGAN): the same
seed gives the same image, psi=0 gives w_avg's image, a mixing grid's cells take their coarse styles from the row and
their fine styles from the column, the interpolation video starts at its seeds' images, projection finds a target
the network made itself, and a model without W refuses mixing and projection in one sentence."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from PIL import Image

from pixelsmith.config.paths import CONF_DIR
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.generate import (
    GenerateError,
    Generator,
    images_for_seeds,
    interpolation_frames,
    load,
    mixing_grid,
    project,
    run,
    seed_z,
    to_uint8,
)
from pixelsmith.gan.networks.dcgan import DCGANGenerator
from pixelsmith.gan.networks.stylegan2 import StyleGAN2Generator, set_noise_mode

PKL = Path(__file__).resolve().parent / "fixtures" / "nvlabs" / "sg2ada_resnet_32px.pkl"


@pytest.fixture(scope="module")
def converted() -> Generator:
    return load(str(PKL), device="cpu")  # const noise: the pickle's own maps


def _fresh_stylegan2(noise_mode: str = "random") -> Generator:
    torch.manual_seed(0)
    net = StyleGAN2Generator(
        resolution=16, channels=3, z_dim=8, w_dim=8, mapping_layers=1, channel_base=64, channel_max=8
    ).eval()
    with torch.no_grad():
        net.mapping.w_avg.normal_()  # as after training: not zero
        for name, param in net.named_parameters():
            if name.endswith("noise_strength"):
                param.fill_(0.5)  # noise that shows in the images
    set_noise_mode(net, noise_mode)
    return Generator(net, "stylegan2", True, 0, torch.device("cpu"))


def _dcgan() -> Generator:
    torch.manual_seed(0)
    return Generator(
        DCGANGenerator(resolution=32, channels=1, z_dim=8, ngf=8).eval(),
        "dcgan",
        False,
        0,
        torch.device("cpu"),
    )


@pytest.mark.parametrize("which", ["converted", "fresh_random_noise", "dcgan"])
def test_the_same_seed_gives_the_same_image_alone_or_among_others(which, converted):
    gen = {"converted": lambda: converted, "fresh_random_noise": _fresh_stylegan2, "dcgan": _dcgan}[which]()
    alone = images_for_seeds(gen, [7])
    assert torch.equal(images_for_seeds(gen, [7]), alone)
    among = images_for_seeds(gen, [3, 7, 11], batch_size=3)
    torch.testing.assert_close(among[1:2], alone, rtol=1e-5, atol=1e-5)  # batched: float rounding only
    assert (among[0] - among[1]).abs().max() > 0.1 * among[1].abs().max()  # other seeds, other images
    if which == "converted":
        # NVlabs' z for the seed (their generate.py: RandomState(seed).randn), through their networks' mapping.
        z = seed_z(7, gen.z_dim)
        torch.testing.assert_close(alone, gen.net(z), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["converted", "fresh_random_noise"])
def test_psi_zero_gives_w_avgs_image_for_every_seed(which, converted):
    gen = converted if which == "converted" else _fresh_stylegan2("none")
    images = images_for_seeds(gen, [0, 1, 2], psi=0.0)
    w_avg = gen.net.mapping.w_avg[None, None].expand(1, gen.net.synthesis.num_ws, -1)
    with torch.no_grad():
        expected = gen.net.synthesis(w_avg)
    for image in images:
        torch.testing.assert_close(image[None], expected, rtol=1e-5, atol=1e-5)
    assert (images_for_seeds(gen, [0]) - expected).abs().max() > 0.01  # psi=1 does not


def test_a_mixing_grid_takes_coarse_styles_from_its_row_and_fine_ones_from_its_column(converted):
    gen = converted
    rows, cols, coarse = [1, 2], [3, 4, 5], 3
    mixed, row_images, col_images = mixing_grid(gen, rows, cols, coarse)
    assert mixed.shape[:2] == (2, 3)
    torch.testing.assert_close(row_images, images_for_seeds(gen, rows), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(col_images, images_for_seeds(gen, cols), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for r, row_seed in enumerate(rows):
            for c, col_seed in enumerate(cols):
                row_ws = gen.net.mapping(seed_z(row_seed, gen.z_dim))
                col_ws = gen.net.mapping(seed_z(col_seed, gen.z_dim))
                ws = torch.cat([row_ws[:, :coarse], col_ws[:, coarse:]], dim=1)
                torch.testing.assert_close(mixed[r, c][None], gen.net.synthesis(ws), rtol=1e-5, atol=1e-5)
                assert (mixed[r, c] - row_images[r]).abs().max() > 1e-3
                assert (mixed[r, c] - col_images[c]).abs().max() > 1e-3
    # All coarse layers from the row but the last: the cell is nearly the row's image, far from the column's.
    near, _, _ = mixing_grid(gen, rows, cols, gen.net.synthesis.num_ws - 1)
    assert (near[0, 0] - row_images[0]).abs().mean() < (near[0, 0] - col_images[0]).abs().mean()


def test_a_model_without_w_refuses_mixing_truncation_and_projection_in_one_sentence():
    gen = _dcgan()
    calls = [
        lambda: mixing_grid(gen, [0], [1], 1),
        lambda: project(gen, torch.zeros(1, 32, 32), steps=1),
        lambda: images_for_seeds(gen, [0], psi=0.5),
    ]
    for call in calls:
        with pytest.raises(GenerateError) as err:
            call()
        message = str(err.value)
        assert "model=dcgan has no mapping network" in message
        assert message.count(". ") == 0 and "\n" not in message  # one sentence


def test_the_interpolation_video_passes_through_each_seed_and_loops(converted, tmp_path):
    from pixelsmith.gan.generate import write_video

    frames = interpolation_frames(converted, [0, 1, 2], frames_per_transition=3)
    assert len(frames) == 9
    seeds_images = to_uint8(images_for_seeds(converted, [0, 1, 2]))
    for index in range(3):
        assert abs(frames[3 * index].astype(int) - seeds_images[index].astype(int)).max() <= 1
    path = write_video(frames, tmp_path / "walk.gif", fps=10)
    with Image.open(path) as gif:
        assert gif.n_frames == 9
    if importlib.util.find_spec("imageio_ffmpeg") is not None:  # the video extra
        import imageio.v2 as imageio

        mp4 = write_video(frames, tmp_path / "walk.mp4", fps=10)
        with imageio.get_reader(mp4, format="FFMPEG") as reader:
            assert reader.count_frames() == 9
    dcgan_frames = interpolation_frames(_dcgan(), [0, 1], frames_per_transition=2)  # z by slerp
    assert len(dcgan_frames) == 4


def test_projection_lowers_its_loss_and_finds_a_target_the_network_made(converted):
    # As NVlabs' projector.py (start at w_avg, their lr ramp and w-noise ramp), with a pixel loss: no LPIPS weights
    # offline. The target is the network's own image of one w, with the network's const noise kept.
    gen = converted
    with torch.no_grad():
        w_target = gen.net.mapping(seed_z(5, gen.z_dim))
        target = gen.net.synthesis(w_target)[0]
    result = project(gen, target, steps=150, loss="pixel", w_avg_samples=500, optimize_noise=False)
    losses = result["losses"]
    start_distance = (gen.net.mapping.w_avg - w_target[0, 0]).norm()
    assert result["final_loss"] < 0.05 * losses[0]
    assert (result["w"][0, 0] - w_target[0, 0]).norm() < 0.5 * start_distance
    assert result["w"].shape == (1, gen.net.synthesis.num_ws, gen.net.w_dim)


def test_noise_maps_are_fitted_under_nvlabs_regularisation():
    gen = _fresh_stylegan2()
    target = torch.zeros(3, 16, 16)
    result = project(gen, target, steps=5, loss="pixel", w_avg_samples=100)
    layers = [m for m in result["generator"].modules() if hasattr(m, "noise_mode")]
    maps = [layer._buffers["noise_const"] for layer in layers]
    assert len(maps) == len(layers) > 0
    for noise in maps:  # normalised after every step, as theirs
        assert abs(float(noise.mean())) < 1e-4 and abs(float(noise.square().mean()) - 1) < 1e-3


def _cfg(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="generate", overrides=list(overrides))


def test_the_command_writes_each_mode_and_refuses_bad_input(tmp_path):
    base = [f"ckpt_path={PKL}", "progress_bar=false", "seeds=0-3"]
    run(_cfg(*base, f"outdir={tmp_path}"))
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"seed{s:04d}.png" for s in range(4)]
    run(_cfg(*base, "mode=grid", f"outdir={tmp_path}"))
    with Image.open(tmp_path / "grid.png") as grid:
        assert grid.size == (64, 64)
    run(_cfg(*base, "mode=mixing", f"outdir={tmp_path}"))
    with Image.open(tmp_path / "mixing.png") as mixing:
        assert mixing.size == (32 * 5, 32 * 4)  # a header row and column around 3 x 4 cells
    target = tmp_path / "target_photo.png"
    Image.new("RGB", (48, 40), (200, 30, 30)).save(target)
    run(_cfg(*base, "mode=project", f"project.target={target}", "project.loss=pixel", "project.steps=3",
             "project.w_avg_samples=50", f"outdir={tmp_path}"))  # fmt: skip
    latent = torch.load(tmp_path / "projected_w.pt", weights_only=True)
    assert latent["w"].shape == (1, 8, 24) and (tmp_path / "projected.png").is_file()
    for bad, says in [
        (["mode=nonsense"], "choose one of images"),
        (["class_idx=1"], "unconditional"),
        (["mode=video", "seeds=[3]"], "two or more"),
        (["mode=project"], "project.target=PHOTO"),
        (["mode=video", "video.path=walk.avi"], ".gif"),
    ]:
        with pytest.raises(PixelsmithError, match=says):
            run(_cfg(*base, *bad, f"outdir={tmp_path / 'bad'}"))
    assert not (tmp_path / "bad").exists()


def test_a_conditional_model_draws_the_class_it_is_given_and_asks_for_one():
    torch.manual_seed(0)
    net = StyleGAN2Generator(
        resolution=16, channels=3, z_dim=8, w_dim=8, mapping_layers=1, channel_base=64, channel_max=8, c_dim=3
    ).eval()
    set_noise_mode(net, "none")
    gen = Generator(net, "stylegan2", True, 3, torch.device("cpu"))
    first, second = (images_for_seeds(gen, [4], class_idx=k) for k in (0, 2))
    assert (first - second).abs().max() > 1e-3  # the label changes the image, the seed being the same
    torch.testing.assert_close(first, net(seed_z(4, 8), torch.eye(3)[:1]))
    for missing in (None, 3):
        with pytest.raises(GenerateError, match="class-conditional .* give class_idx=0..2"):
            images_for_seeds(gen, [4], class_idx=missing)


@pytest.mark.slow  # ~20 s on two loaded cores (a CNN's first calls at new shapes): the full run (`pytest --all`) only
def test_projection_runs_under_an_lpips_loss_given_its_backbone_file(converted, tmp_path):
    # A random squeezenet stands in for the ImageNet one (no download here): this checks the LPIPS road of
    # projection (the backbone file read as data, grayscale/colour handling, the loss falling), not LPIPS' values.
    import torchvision

    weights = tmp_path / "squeezenet1_1.pth"
    torch.manual_seed(0)
    torch.save(torchvision.models.squeezenet1_1(weights=None).state_dict(), weights)
    with torch.no_grad():
        target = converted.net.synthesis(converted.net.mapping(seed_z(9, converted.z_dim)))[0]
    options = {"lpips_net": "squeeze", "lpips_backbone_weights": str(weights)}
    result = project(
        converted,
        target,
        steps=40,
        loss="lpips",
        w_avg_samples=200,
        optimize_noise=False,
        loss_options=options,
    )
    assert result["final_loss"] < result["losses"][0]
