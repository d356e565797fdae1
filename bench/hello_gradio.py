"""The start-up baseline: a hello-world Gradio app, launched the way app.py launches ours (queue, host, port).

.venv/bin/python bench/hello_gradio.py --port 7861
"""

from __future__ import annotations

import argparse

import gradio as gr


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7861)
    args = parser.parse_args(argv)

    with gr.Blocks(title="Hello") as demo:
        gr.Markdown("# Hello")
        name = gr.Textbox(label="Name")
        greeting = gr.Textbox(label="Greeting")
        gr.Button("Greet").click(lambda n: f"Hello {n}!", name, greeting, api_name="greet")
    demo.queue(default_concurrency_limit=1)
    demo.launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
