"""What the routes do, without HTTP: between the routers (routes/) and the task runtimes (runtime.py).

As in vLLM's OpenAI entrypoint, a route checks limits, declares its status codes and maps errors to
them; the work it shares with other routes, or that is more than HTTP, is here, one module per concern:
`predictions` (a prediction as the api answers it), `unlabelled` (a task's pool of unlabelled texts and
the suggestions drawn from it), `examples` (recording labelled examples and what follows), `training`
(queueing a task's automatic job). Routes import from here, never from each other
(tests/services/test_layers.py).
"""
