"""Images in (issue 30): a synthetic LLaVA-style projector on llama.cpp's libmtmd, through the real API and clients.

Skipped where llama-cpp-python was built without libmtmd (-DLLAVA_BUILD=OFF): packaging/dev.sh builds it."""
from __future__ import annotations

import base64
import struct
import threading

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.llamacpp.vision import mtmd_available  # noqa: E402

if not mtmd_available():
    pytest.skip("this llama-cpp-python build has no libmtmd (built with -DLLAVA_BUILD=OFF)", allow_module_level=True)

from api_harness import start_daemon, upload_model  # noqa: E402
from vision_util import b64, create_vision_model, png, vision_files  # noqa: E402

NAME = "vis:latest"
IMAGE_TOKENS = 16  # (32 / 8)^2 rows per image


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("vision"), backend="llamacpp")
    create_vision_model(d.url, "vis")
    upload_model(d.url, vision_files()[0], "txt")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon):
    with httpx.Client(base_url=daemon.url, timeout=300) as c:
        yield c


def loaded(daemon, name: str = NAME):
    return daemon.ctx.manager.models[name]


def gen(client, images, prompt="what is this?", n=6, **kw):
    body = {"model": "vis", "prompt": prompt, "images": images, "stream": False,
            "options": {"temperature": 0, "num_predict": n, "seed": 1}, **kw}
    return client.post("/api/generate", json=body)


def test_show_lists_vision_and_the_projector(client):
    body = client.post("/api/show", json={"model": "vis"}).json()
    assert "vision" in body["capabilities"] and "completion" in body["capabilities"]
    assert body["projector_info"]["clip.projector_type"] == "mlp"
    assert body["projector_info"]["general.architecture"] == "clip"
    assert body["modelfile"].count("\nFROM ") == 2  # the model and its projector, as Ollama prints them
    assert "vision" not in client.post("/api/show", json={"model": "txt"}).json()["capabilities"]


def test_image_in_tokens_out_and_the_image_matters(client):
    a = gen(client, [b64(png(seed=1))], logprobs=True, top_logprobs=3)
    assert a.status_code == 200, a.text
    a = a.json()
    assert a["eval_count"] == 6 and a["done"]
    assert a["prompt_eval_count"] > IMAGE_TOKENS  # the image's rows are prompt positions
    assert all(t >= 0 for t in a["context"])  # image placeholders never leave the daemon
    b = gen(client, [b64(png(seed=2))], logprobs=True, top_logprobs=3).json()
    # a different image, the same text: the first token's distribution moves (the embeddings reach the model)
    la = [x["logprob"] for x in a["logprobs"][0]["top_logprobs"]]
    lb = [x["logprob"] for x in b["logprobs"][0]["top_logprobs"]]
    assert la != lb


def test_same_image_twice_comes_from_the_caches(client, daemon):
    img = b64(png(seed=3))
    first = gen(client, [img], prompt="describe it").json()
    model = loaded(daemon)
    encodes, hits = model.runner.vision.encodes, model.engine.stats().cache_hit_tokens
    second = gen(client, [img], prompt="describe it").json()
    assert model.runner.vision.encodes == encodes  # no second encode
    same_hit = model.engine.stats().cache_hit_tokens - hits
    assert second["response"] == first["response"]
    hits = model.engine.stats().cache_hit_tokens
    other = gen(client, [b64(png(seed=4))], prompt="describe it").json()
    other_hit = model.engine.stats().cache_hit_tokens - hits
    assert model.runner.vision.encodes == encodes + 1 and other["eval_count"] == 6
    # the same image's span came from the prefix cache; another image's did not (only the text before it)
    assert same_hit - other_hit >= IMAGE_TOKENS, (same_hit, other_hit)


def test_chat_with_images_in_two_messages(client):
    msgs = [{"role": "user", "content": "first", "images": [b64(png(seed=5))]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and this [img] one?", "images": [b64(png(seed=6))]}]
    r = client.post("/api/chat", json={"model": "vis", "messages": msgs, "stream": False,
                                       "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] > 2 * IMAGE_TOKENS


def _bad_png_header(w: int, h: int) -> bytes:
    head = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + head + b"\0\0\0\0"


@pytest.mark.parametrize("image, words", [
    ("not base64 at all!!", "not valid base64"),
    (b64(b"just some text, not an image"), "not a PNG, JPEG, GIF or BMP"),
    (b64(_bad_png_header(100000, 100000)), "limit is 8192 per side"),
    (b64(png()[:60]), "could not be decoded"),  # a real header, the pixels cut off
    (b64(b"RIFF\0\0\0\0WEBPVP8 "), "WebP"),
    ("", "empty"),
])
def test_bad_images_are_400(client, image, words):
    r = gen(client, [image])
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]


def test_too_many_and_too_big(client):
    r = gen(client, [b64(png())] * 17)
    assert r.status_code == 400 and "too many images" in r.json()["error"]
    r = gen(client, ["A" * (30 << 20)])
    assert r.status_code == 400 and "too large" in r.json()["error"]


def test_a_model_without_vision_says_so(client):
    r = client.post("/api/generate", json={"model": "txt", "prompt": "hi", "images": [b64(png())], "stream": False})
    assert r.status_code == 400 and r.json()["error"] == "model 'txt' does not support images"
    r = client.post("/api/chat", json={"model": "txt", "stream": False,
                                       "messages": [{"role": "user", "content": "hi", "images": [b64(png())]}]})
    assert r.status_code == 400 and "does not support images" in r.json()["error"]


def test_ollama_client_chat_with_an_image(daemon):
    import ollama

    c = ollama.Client(host=daemon.url)
    r = c.chat(model="vis", messages=[{"role": "user", "content": "what is it?", "images": [png(seed=7)]}],
               options={"num_predict": 5})
    assert r.message.role == "assistant" and r.eval_count == 5
    assert r.prompt_eval_count > IMAGE_TOKENS


def test_openai_image_url_data_url(daemon):
    import openai

    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")
    url = "data:image/png;base64," + b64(png(seed=8))
    r = c.chat.completions.create(model="vis", max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    assert r.usage.prompt_tokens > IMAGE_TOKENS and r.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError, match="remote image URLs are not fetched"):
        c.chat.completions.create(model="vis", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])


def test_langchain_chat_ollama_with_an_image(daemon):
    lc = pytest.importorskip("langchain_ollama")
    from langchain_core.messages import HumanMessage

    llm = lc.ChatOllama(model="vis", base_url=daemon.url, num_predict=4)
    msg = HumanMessage(content=[{"type": "text", "text": "what is it?"},
                                {"type": "image_url", "image_url": "data:image/png;base64," + b64(png(seed=9))}])
    out = llm.invoke([msg])
    assert out.usage_metadata["input_tokens"] > IMAGE_TOKENS


def test_streams_keep_decoding_while_an_image_is_encoded(client, daemon):
    """The encode runs in the prepare worker: held there mid-encode, another stream still gets its tokens."""
    gen(client, [b64(png(seed=10))], n=1)  # loaded
    vision = loaded(daemon).runner.vision
    entered, release = threading.Event(), threading.Event()
    original = vision._rows

    def held_rows(*a, **kw):
        entered.set()
        assert release.wait(120)
        return original(*a, **kw)

    vision._rows = held_rows
    image_reply: dict = {}
    try:
        with httpx.Client(base_url=daemon.url, timeout=300) as c2, c2.stream(
                "POST", "/api/generate", json={"model": "vis", "prompt": "count", "options": {
                    "num_predict": 4000, "temperature": 0}}) as stream:
            lines = stream.iter_lines()
            next(lines)  # streaming
            t = threading.Thread(target=lambda: image_reply.update(
                gen(client, [b64(png(seed=11))], n=3).json()))
            t.start()
            assert entered.wait(120), "the image request never reached the encoder"
            got = 0
            for _ in lines:  # tokens keep coming while the encode is held
                got += 1
                if got == 20:
                    break
            assert got == 20 and not image_reply
            release.set()
            t.join(120)
            assert image_reply.get("eval_count") == 3
    finally:
        release.set()
        vision._rows = original


def test_anthropic_image_block(daemon):
    import anthropic

    c = anthropic.Anthropic(base_url=daemon.url, api_key="x")
    r = c.messages.create(model="vis", max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png(seed=12))}},
        {"type": "text", "text": "what is it?"}]}])
    assert r.usage.input_tokens > IMAGE_TOKENS and r.usage.output_tokens == 4


def test_responses_input_image(daemon):
    import openai

    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")
    r = c.responses.create(model="vis", max_output_tokens=4, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": "data:image/png;base64," + b64(png(seed=13))}]}])
    assert r.usage.input_tokens > IMAGE_TOKENS


@pytest.mark.parametrize("w, h", [(1, 1), (300, 20), (20, 300)])
def test_odd_sizes_are_resized_not_refused(client, w, h):
    r = gen(client, [b64(png(w, h, seed=w))], n=2)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] > IMAGE_TOKENS


def test_jpeg_in_and_a_truncated_jpeg_header(client):
    pil = pytest.importorskip("PIL.Image")
    import io

    buf = io.BytesIO()
    pil.fromarray(__import__("numpy").random.default_rng(1).integers(0, 256, (40, 50, 3), dtype="uint8")).save(
        buf, format="JPEG")
    data = buf.getvalue()
    from evenflow.daemon.api.pipeline.images import image_size

    assert image_size(data) == ("JPEG", (50, 40))
    assert gen(client, [b64(data)], n=2).status_code == 200
    r = gen(client, [b64(data[:8])], n=2)
    assert r.status_code == 400 and "truncated or corrupt JPEG" in r.json()["error"]


def test_concurrent_image_requests(daemon):
    """Several prepare workers encode at once: the encoder's lock serialises its mtmd context."""
    out: list = [None] * 4

    def one(i):
        with httpx.Client(base_url=daemon.url, timeout=300) as c:
            out[i] = gen(c, [b64(png(seed=100 + i))], n=3)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r is not None and r.status_code == 200 and r.json()["eval_count"] == 3 for r in out), out
