"""ddprun's worker API for Python training scripts: tell the agent that this rank makes progress.

    import ddprun

    for step, batch in enumerate(loader):
        ...
        ddprun.report_step(step)          # a heartbeat carrying the step
    with ddprun.section("checkpoint"):    # a named phase: a hang inside it is reported as such
        save(model)

Under ddprun the agent always listens: beats tell it that a rank is alive past --finish_timeout,
how far an attempt got (--stop_without_progress) and, with step times, which rank straggles. With
--hang_timeout, a rank whose beats stop for longer than the timeout is declared hung, with its last
step and section, instead of waiting out a collective's own timeout (NCCL's is 10-30 minutes).
Outside ddprun every call does nothing (enabled() says which). No call blocks or raises into
training, and a beat costs at most one non-blocking send (each function's docstring says what it
costs). Standard library only and typed (py.typed); the implementation is ddprun._heartbeat,
whose names are private. ddprun.lightning has a PyTorch Lightning callback; ddprun.recovery
(`ddprun --recovery=in_process`) runs a training function so that the surviving ranks of a job
keep their processes when one rank dies: recovery.run(train, state) re-forms the process group in
the new round ddprun announces and resumes from the furthest rank's last committed step. Neither
is imported here (import them by name).
"""

# The API alone: `dir(ddprun)` lists these four and the module's dunders (and `lightning` once
# ddprun.lightning is imported, as the import system binds a submodule in its package).
from ddprun import _heartbeat
from ddprun._heartbeat import enabled, heartbeat, report_step, section

__all__ = ["enabled", "heartbeat", "report_step", "section"]

# Importing _heartbeat bound it here; unbind it so that the namespace is the API. It stays
# reachable as `from ddprun import _heartbeat` (what the tests do), not as `ddprun._heartbeat`.
del _heartbeat
