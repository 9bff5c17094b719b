"""The model's own chat template as kernelrl renders prompts with it ([policy] template = "auto").

    scripts/python tasks/chat_template.py MODEL_DIR

renders two conversations with transformers' apply_chat_template (the template in MODEL_DIR's
tokenizer_config.json or chat_template.jinja, add_generation_prompt=True), each message a sentinel,
and prints one JSON object: "template", the first turn's prompt with {system} and {user} where the
system and user messages go; and for later turns of an episode, the text the template puts between
a user message and the assistant's answer after it ("user_to_assistant"), between an answer and the
next user message ("assistant_to_user"), and after the last user message ("generation"). Or
{"error": "..."} when the model has no template or it renders something these pieces cannot
rebuild (a message changed, reordered, or missing); kernelrl then falls back to a built-in template
and says so.
"""
import json
import sys

S, U, A, F = "\x00KRL-SYSTEM\x00", "\x00KRL-USER\x00", "\x00KRL-ANSWER\x00", "\x00KRL-FEEDBACK\x00"


def pieces(model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tok, "chat_template", None):
        return {"error": "%s has no chat template (tokenizer_config.json chat_template)" % model_dir}

    def render(messages):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    one = render([{"role": "system", "content": S}, {"role": "user", "content": U}])
    two = render([{"role": "system", "content": S}, {"role": "user", "content": U},
                  {"role": "assistant", "content": A}, {"role": "user", "content": F}])
    for text, marks in [(one, [S, U]), (two, [S, U, A, F])]:
        at = [text.find(m) for m in marks]
        if any(x < 0 for x in at) or any(text.count(m) != 1 for m in marks) or at != sorted(at):
            return {"error": "the chat template does not render each message once and in order"}
    if "{system}" in one or "{user}" in one:
        return {"error": "the chat template itself holds {system} or {user}"}
    u_end, a_at, f_at = two.find(U) + len(U), two.find(A), two.find(F)
    return {"template": one.replace(S, "{system}").replace(U, "{user}"),
            "user_to_assistant": two[u_end:a_at],
            "assistant_to_user": two[a_at + len(A):f_at],
            "generation": two[f_at + len(F):],
            "first_turn_prefix_matches": two[:u_end] == one[:one.find(U) + len(U)]}


def main():
    try:
        out = pieces(sys.argv[1])
    except Exception as e:  # a template that raises (e.g. one without a system role) is a fallback, not a crash
        out = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
