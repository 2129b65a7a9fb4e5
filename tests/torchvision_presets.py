"""torchvision's classification reference transforms (``references/classification/presets.py``,
``ClassificationPresetTrain`` with ``backend="tensor"``, ``use_v2=False``), copied in plain torch.

torchvision cannot be installed beside torch 2.13.0 here (PyPI's wheels for it fail to import: "operator
torchvision::nms does not exist"), so this is a faithful copy of the v1 transforms the preset composes, on uint8
CHW tensors: ``RandomResizedCrop`` (bilinear, antialias), ``RandomHorizontalFlip``, ``RandAugment`` (2 ops,
magnitude 9, 31 bins, the 14 ops of its augmentation space), ``ConvertImageDtype(float)``, ``Normalize``. What
matters to the tests is kept exactly: every random number is drawn from torch's global generator with the very
calls and in the very order torchvision makes them (``torch.empty(1).uniform_``, ``torch.randint``, ``torch.rand``),
so that per-sample seeding is tested against torchvision's pattern of draws; the pixel operations follow
torchvision's tensor kernels (``_get_inverse_affine_matrix``, ``_gen_affine_grid``, ``_blend``, ``_scale_channel``…).
"""

from __future__ import annotations

import math

import torch
from torch.nn.functional import conv2d, grid_sample, interpolate


# --- functional (torchvision.transforms._functional_tensor) ---------------------------------------------------------
def _cast_in(img: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    return img.unsqueeze(0).to(torch.float32), img.dtype


def _cast_out(img: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    img = img.squeeze(0)
    return torch.round(img).to(dtype) if not dtype.is_floating_point else img.to(dtype)


def resized_crop(img: torch.Tensor, top: int, left: int, height: int, width: int, size: list[int]) -> torch.Tensor:
    img = img[..., top:top + height, left:left + width]
    x, dtype = _cast_in(img)
    return _cast_out(interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True), dtype)


def _inverse_affine(center, angle, translate, scale, shear) -> list[float]:
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _affine_grid(theta: torch.Tensor, w: int, h: int) -> torch.Tensor:
    base = torch.empty(1, h, w, 3, dtype=theta.dtype)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=theta.dtype)
    return base.view(1, h * w, 3).bmm(rescaled).view(1, h, w, 2)


def _warp(img: torch.Tensor, matrix: list[float]) -> torch.Tensor:
    x, dtype = _cast_in(img)
    grid = _affine_grid(torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3), img.shape[-1], img.shape[-2])
    return _cast_out(grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False), dtype)


def affine(img: torch.Tensor, translate: list[int], shear: list[float], center: list[int] | None) -> torch.Tensor:
    height, width = img.shape[-2:]
    center_f = [0.0, 0.0] if center is None else [1.0 * (c - s * 0.5) for c, s in zip(center, [width, height])]
    return _warp(img, _inverse_affine(center_f, 0.0, [1.0 * t for t in translate], 1.0, shear))


def rotate(img: torch.Tensor, angle: float) -> torch.Tensor:
    return _warp(img, _inverse_affine([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0]))


def _blend(img1: torch.Tensor, img2: torch.Tensor, ratio: float) -> torch.Tensor:
    return (ratio * img1 + (1.0 - ratio) * img2).clamp(0, 255).to(img1.dtype)


def _grayscale(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype).unsqueeze(dim=-3)


def adjust_contrast(img: torch.Tensor, factor: float) -> torch.Tensor:
    mean = torch.mean(_grayscale(img).to(torch.float32), dim=(-3, -2, -1), keepdim=True)
    return _blend(img, mean, factor)


def adjust_sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    kernel = torch.ones((3, 3), dtype=torch.float32)
    kernel[1, 1] = 5.0
    kernel /= kernel.sum()
    kernel = kernel.expand(img.shape[-3], 1, 3, 3)
    x, dtype = _cast_in(img)
    blurred = img.clone()
    blurred[..., 1:-1, 1:-1] = _cast_out(conv2d(x, kernel, groups=x.shape[-3]), dtype)
    return _blend(img, blurred, factor)


def autocontrast(img: torch.Tensor) -> torch.Tensor:
    minimum = img.amin(dim=(-2, -1), keepdim=True).to(torch.float32)
    maximum = img.amax(dim=(-2, -1), keepdim=True).to(torch.float32)
    scale = 255.0 / (maximum - minimum)
    flat = torch.isfinite(scale).logical_not()
    minimum[flat], scale[flat] = 0, 1
    return ((img - minimum) * scale).clamp(0, 255).to(img.dtype)


def _scale_channel(chan: torch.Tensor) -> torch.Tensor:
    hist = torch.bincount(chan.reshape(-1), minlength=256)
    nonzero = hist[hist != 0]
    step = torch.div(nonzero[:-1].sum(), 255, rounding_mode="floor")
    if step == 0:
        return chan
    lut = torch.div(torch.cumsum(hist, 0) + torch.div(step, 2, rounding_mode="floor"), step, rounding_mode="floor")
    lut = torch.nn.functional.pad(lut, [1, 0])[:-1].clamp(0, 255)
    return lut[chan.to(torch.int64)].to(torch.uint8)


def equalize(img: torch.Tensor) -> torch.Tensor:
    return torch.stack([_scale_channel(img[c]) for c in range(img.size(0))])


# --- transforms (torchvision.transforms.transforms, .autoaugment) ---------------------------------------------------
class RandomResizedCrop:
    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)) -> None:
        self.size, self.scale, self.ratio = [size, size], scale, ratio

    def get_params(self, img: torch.Tensor) -> tuple[int, int, int, int]:
        height, width = img.shape[-2:]
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                return i, j, h, w
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        i, j, h, w = self.get_params(img)
        return resized_crop(img, i, j, h, w, self.size)


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.flip(-1) if torch.rand(1) < self.p else img


class RandAugment:
    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31) -> None:
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, num_magnitude_bins

    @staticmethod
    def _augmentation_space(num_bins: int, image_size: tuple[int, int]) -> dict[str, tuple[torch.Tensor, bool]]:
        return {
            "Identity": (torch.tensor(0.0), False),
            "ShearX": (torch.linspace(0.0, 0.3, num_bins), True),
            "ShearY": (torch.linspace(0.0, 0.3, num_bins), True),
            "TranslateX": (torch.linspace(0.0, 150.0 / 331.0 * image_size[1], num_bins), True),
            "TranslateY": (torch.linspace(0.0, 150.0 / 331.0 * image_size[0], num_bins), True),
            "Rotate": (torch.linspace(0.0, 30.0, num_bins), True),
            "Brightness": (torch.linspace(0.0, 0.9, num_bins), True),
            "Color": (torch.linspace(0.0, 0.9, num_bins), True),
            "Contrast": (torch.linspace(0.0, 0.9, num_bins), True),
            "Sharpness": (torch.linspace(0.0, 0.9, num_bins), True),
            "Posterize": (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4)).round().int(), False),
            "Solarize": (torch.linspace(255.0, 0.0, num_bins), False),
            "AutoContrast": (torch.tensor(0.0), False),
            "Equalize": (torch.tensor(0.0), False),
        }

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        height, width = img.shape[-2:]
        op_meta = self._augmentation_space(self.num_magnitude_bins, (height, width))
        for _ in range(self.num_ops):
            op_index = int(torch.randint(len(op_meta), (1,)).item())
            op_name = list(op_meta.keys())[op_index]
            magnitudes, signed = op_meta[op_name]
            magnitude = float(magnitudes[self.magnitude].item()) if magnitudes.ndim > 0 else 0.0
            if signed and torch.randint(2, (1,)):
                magnitude *= -1.0
            img = _apply_op(img, op_name, magnitude)
        return img


def _apply_op(img: torch.Tensor, op_name: str, magnitude: float) -> torch.Tensor:
    if op_name == "ShearX":
        return affine(img, [0, 0], [math.degrees(math.atan(magnitude)), 0.0], center=[0, 0])
    if op_name == "ShearY":
        return affine(img, [0, 0], [0.0, math.degrees(math.atan(magnitude))], center=[0, 0])
    if op_name == "TranslateX":
        return affine(img, [int(magnitude), 0], [0.0, 0.0], center=None)
    if op_name == "TranslateY":
        return affine(img, [0, int(magnitude)], [0.0, 0.0], center=None)
    if op_name == "Rotate":
        return rotate(img, magnitude)
    if op_name == "Brightness":
        return _blend(img, torch.zeros_like(img), 1.0 + magnitude)
    if op_name == "Color":
        return _blend(img, _grayscale(img), 1.0 + magnitude)
    if op_name == "Contrast":
        return adjust_contrast(img, 1.0 + magnitude)
    if op_name == "Sharpness":
        return adjust_sharpness(img, 1.0 + magnitude)
    if op_name == "Posterize":
        return img & -int(2 ** (8 - int(magnitude)))
    if op_name == "Solarize":
        return torch.where(img >= magnitude, 255 - img, img)
    if op_name == "AutoContrast":
        return autocontrast(img)
    if op_name == "Equalize":
        return equalize(img)
    return img  # Identity


class ConvertImageDtype:
    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.to(torch.float32).div_(255)


class Normalize:
    def __init__(self, mean, std) -> None:
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return (img - self.mean) / self.std


class Compose:
    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class ClassificationPresetTrain:
    """presets.ClassificationPresetTrain(crop_size=..., auto_augment_policy="ra", backend="tensor"): the image arrives
    as a uint8 tensor (the ``backend="tensor"`` path puts ``PILToTensor`` first; our folder loads tensors)."""

    def __init__(self, *, crop_size: int, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), hflip_prob=0.5,
                 auto_augment_policy=None, ra_magnitude=9, random_erase_prob=0.0) -> None:
        transforms = [RandomResizedCrop(crop_size)]
        if hflip_prob > 0:
            transforms.append(RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy == "ra":
            transforms.append(RandAugment(magnitude=ra_magnitude))
        elif auto_augment_policy is not None:
            raise ValueError(f"this copy has RandAugment only, not {auto_augment_policy!r}")
        if random_erase_prob > 0:
            raise ValueError("this copy has no RandomErasing")
        transforms.extend([ConvertImageDtype(), Normalize(mean=mean, std=std)])
        self.transforms = Compose(transforms)

    def __call__(self, img):
        return self.transforms(img)
