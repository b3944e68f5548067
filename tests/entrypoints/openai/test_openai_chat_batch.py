"""POST /v1/chat/completions/batch: many conversations in one body, one choice per conversation
in order, each with its own status and error (one conversation's bad input or failure fails
only its choice); what the batch route does not take is a 400 naming the field."""

from __future__ import annotations

from omnistage.engine.outputs import OmniOutput


def test_each_conversation_gets_its_own_choice_status_and_error(app_client):
    http, engine = app_client("text")
    plain = engine.generate

    async def generate(prompt, params=None, request_id=None, *, modalities=None, session_id=None):
        if "boom" in str(prompt):  # this conversation's engine request fails
            yield OmniOutput(request_id, finished=True, finish_reason="error", error="stage 0 (llm): engine step raised")
            return
        async for out in plain(prompt, params, request_id, modalities=modalities, session_id=session_id):
            yield out

    engine.generate = generate
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "boom"}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}],
        [{"role": "user", "content": "bye"}],
    ]
    resp = http.post("/v1/chat/completions/batch", json={"messages": conversations, "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    ok, failed, bad, last = body["choices"]
    for choice in (ok, last):
        assert choice["status"] == 200 and choice["error"] is None
        assert choice["message"]["content"] == "Hello from" and choice["finish_reason"] == "stop"
    assert failed["status"] == 500 and failed["message"] is None and failed["finish_reason"] == "error"
    assert "engine step raised" in failed["error"]["message"]
    assert bad["status"] == 400 and bad["error"]["param"].startswith("messages[2][0].content[0]"), bad["error"]
    # The engine saw each conversation that got that far as its own request (run together, so in any
    # order), the shared fields on each.
    prompts = sorted(str(prompt["messages"]) for prompt, params, _ in engine.requests)
    assert prompts == sorted(map(str, [conversations[0], conversations[3]]))
    assert all(p.max_tokens == 2 for _, p, _ in engine.requests)
    assert body["usage"]["completion_tokens"] == 2 * len(engine.text)  # summed over the answered ones


def test_what_the_batch_route_does_not_take_is_a_400_naming_it(app_client):
    http, _ = app_client("text")
    conversation = [{"role": "user", "content": "hi"}]
    for extra, param, status in (({"stream": True}, "stream", 400), ({"n": 2}, "n", 400),
                                 ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", 400),
                                 ({"model": "other"}, "model", 404)):  # as on /v1/chat/completions
        resp = http.post("/v1/chat/completions/batch", json={"messages": [conversation], **extra})
        assert resp.status_code == status and resp.json()["error"]["param"] == param, resp.text
    for messages, param in (([], "messages"), ([[]], "messages[0]"), (conversation, "messages[0]")):
        resp = http.post("/v1/chat/completions/batch", json={"messages": messages})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
