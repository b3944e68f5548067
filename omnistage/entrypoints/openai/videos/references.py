"""The media a video form carries, read into the engine prompt's inputs.

    input_reference             one image: an upload, or a URL (fetched if its host is allowed)
    input_references            repeated uploads, each an image, a video or an audio file by its
                                Content-Type (else its file name's extension), kept in order per kind
    control_video, mask_video   a control video and its mask: uploads or URLs
    audio_reference             {"audio_url": ...}

What the model takes comes from its pipeline class (capabilities.py): an image-to-video model
needs exactly one image; a model that takes images optionally takes any number (Wan-VACE's
reference images, LTX-2's conditions; the family checks the count); a model that takes a
video (Wan-VACE's control video, Cosmos3's conditioning clip) takes one, from `control_video`
or `input_references`. No served video family conditions on audio, so an audio reference (or
an audio file among `input_references`) is refused by name rather than dropped.

`VideoInputs.fields` keeps which form field each engine input came from, so an engine refusal
of `image` names `input_references` when that is what the client sent.
"""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import UploadFile

from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import Form, read_upload
from omnistage.entrypoints.openai.errors import bad_request
from omnistage.entrypoints.openai.media_inputs import InputMedia

FILE_FIELDS = ("input_reference", "input_references", "control_video", "mask_video")
URL_FIELDS = ("input_reference", "control_video", "mask_video")
CONTROL_FIELDS = {"control_video": "video", "mask_video": "mask"}  # form field -> the engine input's key
MAX_REFERENCES = 16
KINDS = ("image", "video", "audio")


@dataclass
class VideoInputs:
    media: dict[str, Any] = field(default_factory=dict)
    """The engine prompt's inputs: `image` (one image, or a list), `video` and `mask` (frames)."""
    fields: dict[str, str] = field(default_factory=dict)
    """Engine input key -> the form field it came from."""


def reference_kind(upload: UploadFile) -> str | None:
    """"image", "video" or "audio" by the part's Content-Type, else by its file name; None if neither says."""
    for mime in (upload.content_type, mimetypes.guess_type(upload.filename or "")[0]):
        kind = (mime or "").split("/")[0].strip().lower()
        if kind in KINDS:
            return kind
    return None


class VideoReferences:
    """Reads a video form's media (the file fields and URLs above) within what the model takes."""

    def __init__(self, capabilities: Capabilities, media: InputMedia):
        self.capabilities = capabilities
        self.media = media

    @property
    def model(self) -> str:
        return self.capabilities.model

    async def read(self, form: Form, urls: dict[str, str | None], audio_reference: str | None) -> VideoInputs:
        """The form's media as engine inputs (`urls`: the URL fields' text values), or a 400 naming the field."""
        if audio_reference is not None:
            raise bad_request(f"audio_reference: model {self.model!r} does not condition on audio (no served video "
                              "family does)", param="audio_reference")
        sorted_refs = await self._sort(form.files.get("input_references", []))
        inputs = VideoInputs()
        images = await self._images(form, urls["input_reference"], sorted_refs["image"], inputs)
        if images:
            inputs.media["image"] = images if len(images) > 1 else images[0]
        for name, key in CONTROL_FIELDS.items():
            frames = await self._control(form, name, urls[name])
            if frames is not None:
                inputs.media[key], inputs.fields[key] = frames, name
        if sorted_refs["video"]:
            await self._reference_video(sorted_refs["video"], inputs)
        return inputs

    async def _sort(self, uploads: list[UploadFile]) -> dict[str, list[tuple[int, UploadFile]]]:
        """`input_references` by kind, each kind in the order sent; audio is refused here."""
        if len(uploads) > MAX_REFERENCES:
            raise bad_request(f"input_references: at most {MAX_REFERENCES} files, got {len(uploads)}",
                              param="input_references")
        kinds: dict[str, list[tuple[int, UploadFile]]] = {kind: [] for kind in KINDS}
        for i, upload in enumerate(uploads):
            kind = reference_kind(upload)
            if kind is None:
                raise bad_request(f"input_references[{i}] ({upload.filename!r}): cannot tell an image, a video or an "
                                  f"audio file from its Content-Type {upload.content_type!r}; send image/*, video/* "
                                  "or audio/*", param="input_references")
            if kind == "audio":
                raise bad_request(f"input_references[{i}] ({upload.filename!r}): an audio file; model "
                                  f"{self.model!r} does not condition on audio (no served video family does)",
                                  param="input_references")
            kinds[kind].append((i, upload))
        return kinds

    async def _images(self, form: Form, url: str | None, references: list[tuple[int, UploadFile]],
                      inputs: VideoInputs) -> list[Any]:
        """The input images, from `input_reference` or from the images among `input_references`."""
        singles = form.files.get("input_reference", [])
        given = len(singles) + (url is not None)
        if given and references:
            raise bad_request("input_references: give the images in input_reference or in input_references, not both",
                              param="input_references")
        name = "input_references" if references else "input_reference"
        needs = self.capabilities.image_input
        if not given and not references:
            if needs == "required":
                raise bad_request(f"input_reference: model {self.model!r} generates from an image; upload one",
                                  param="input_reference")
            return []
        if needs == "none":
            raise bad_request(f"{name}: model {self.model!r} is text-to-video and takes no image", param=name)
        if given + len(references) > 1 and needs != "optional":
            raise bad_request(f"{name}: model {self.model!r} takes one image", param=name)
        inputs.fields["image"] = name
        images = [] if url is None else [await self.media.run(self.media.image_ref, url, "input_reference")]
        for upload in singles:
            images.append(await self.media.image(await read_upload(upload, "input_reference"), "input_reference"))
        for i, upload in references:
            images.append(await self.media.image(await read_upload(upload, name), f"{name}[{i}]"))
        return images

    async def _control(self, form: Form, name: str, url: str | None) -> list[Any] | None:
        """A control video or its mask as frames (an upload or a URL), or None when not given."""
        uploads = form.files.get(name, [])
        if not uploads and url is None:
            return None
        if not self.capabilities.video_input:
            raise bad_request(f"{name}: model {self.model!r} takes no control video", param=name)
        if len(uploads) + (url is not None) > 1:
            raise bad_request(f"{name}: give one video", param=name)
        if url is not None:
            return await self.media.run(self.media.video_frames_ref, url, name)
        return await self.media.video(await read_upload(uploads[0], name), name)

    async def _reference_video(self, videos: list[tuple[int, UploadFile]], inputs: VideoInputs) -> None:
        """A video among `input_references`: the model's control or conditioning video."""
        name = "input_references"
        if not self.capabilities.video_input:
            raise bad_request(f"{name}[{videos[0][0]}]: a video; model {self.model!r} takes no input video",
                              param=name)
        if len(videos) > 1 or "video" in inputs.media:
            raise bad_request(f"{name}: give one video (in control_video or input_references)", param=name)
        i, upload = videos[0]
        inputs.media["video"] = await self.media.video(await read_upload(upload, name), f"{name}[{i}]")
        inputs.fields["video"] = name
