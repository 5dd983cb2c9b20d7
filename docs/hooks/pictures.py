"""MkDocs hook: draws the pictures of the docs pages when the site is built, so they are always
those of the current code. A page asks for one with a line ``<!-- picture: NAME -->``; the line
becomes the picture's HTML (a ``shardlab.viz`` view, an object's own display, or a matplotlib
figure as inline SVG). Names: :data:`PICTURES`."""

from __future__ import annotations

import io
import re

_MARK = re.compile(r"^<!-- picture: ([\w-]+) -->$", re.M)


def _sl():
    import numpy as np
    import shardlab as sl

    return np, sl


def _svg_of(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    svg = buf.getvalue()
    return '<div class="sl-figure" style="overflow-x:auto">' + svg[svg.index("<svg"):] + "</div>"


def _ledger():
    np, sl = _sl()
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "y"), mesh=mesh,
                     in_specs=(sl.P(None, "y"), sl.P("y")), out_specs=sl.P())
    with sl.Ledger() as ledger:
        f(np.ones((256, 512), np.float32), np.ones((512, 256), np.float32))
    return ledger


def _training_step():
    np, sl = _sl()
    from shardlab import train
    from shardlab.models import presets

    cfg = presets.get("llama2-13b").replace(num_layers=2)
    mesh = sl.make_mesh((8, 4), ("x", "y"), hardware="tpu-v5p", abstract=True)
    return train.estimate(cfg, train.Strategy("fsdp_tp", data="x", model="y", zero=3, sequence_parallel=True),
                          mesh, "tpu-v5p", batch=16, seq=4096)


def _strategies():
    np, sl = _sl()
    from shardlab import train
    from shardlab.models import presets

    cfg = presets.get("llama2-13b").replace(num_layers=2)
    plans = {"DP over 16": (train.Strategy("dp", data="x"), (16,)),
             "FSDP over 16": (train.Strategy("fsdp", data="x", zero=3), (16,)),
             "TP over 8": (train.Strategy("tp", model="x"), (8,))}
    return sl.viz.strategies({name: train.estimate(cfg, s, sl.make_mesh(shape, ("x",), hardware="tpu-v5p", abstract=True),
                                                   "tpu-v5p", batch=16, seq=4096) for name, (s, shape) in plans.items()},
                             title="LLaMA-2 13B (2 layers), 16 sequences of 4k on TPU v5p: memory and traffic per chip")


def _view(make):
    return lambda: make()._repr_html_()


def _sharding_2d():
    np, sl = _sl()
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    return sl.viz.sharding((16, 8), sl.NamedSharding(mesh, sl.P("x", "y")), dtype="bfloat16")


def _sharding_3d():
    np, sl = _sl()
    mesh = sl.make_mesh((2, 2, 2), ("x", "y", "z"), hardware="tpu-v5p")
    return sl.viz.sharding((4, 4, 4), sl.NamedSharding(mesh, sl.P("x", "y", "z")), dtype="float32")


def _specs():
    np, sl = _sl()
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    views = [sl.viz.sharding((8, 8), sl.NamedSharding(mesh, spec), dtype="float32")
             for spec in (sl.P(), sl.P("x"), sl.P("x", "y"), sl.P(("x", "y")))]
    return ('<div style="display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start">'
            + "".join(v._repr_html_() for v in views) + "</div>")


def _storage():
    np, sl = _sl()
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    return sl.viz.sharding((8, 6), sl.NamedSharding(mesh, sl.P("x")), dtype="float32")


def _collective(op, shape=(8,), names=("x",), axis="x", hw="tpu-v5e"):
    def make():
        np, sl = _sl()
        return sl.viz.collective(op, sl.make_mesh(shape, names, hardware=hw), axis, nbytes=2**30)
    return make


def _links(op, shape, names, hw):
    def make():
        np, sl = _sl()
        mesh = sl.make_mesh(shape, names, hardware=hw)
        return sl.viz.link_traffic(sl.cost.collective_time(op, 2**30, axes=names, mesh=mesh))
    return make


def _ring():
    np, sl = _sl()
    return sl.viz.link_traffic(sl.cost.schedule("all_gather", 8, "ring", 2**30))


def _pipeline(kind):
    def make():
        from shardlab.train import pipeline as pp
        sched = {"1f1b": lambda: pp.one_f_one_b(4, 8), "interleaved": lambda: pp.interleaved_1f1b(4, 8, 2),
                 "zero_bubble": lambda: pp.zb_h1(4, 8)}[kind]()
        return pp.clock(sched)._repr_html_()
    return make


def _roofline_plot():
    import matplotlib
    matplotlib.use("Agg")
    np, sl = _sl()
    fig = sl.viz.roofline_plot(_ledger().roofline())
    return _svg_of(getattr(fig, "figure", fig))


def _sweep():
    import matplotlib
    matplotlib.use("Agg")
    np, sl = _sl()
    fig = sl.viz.collective_sweep(["all_gather", "psum"], ["tpu-v5e", "h100"])
    return _svg_of(getattr(fig, "figure", fig))


def _strategy():
    import matplotlib
    matplotlib.use("Agg")
    np, sl = _sl()
    fig = sl.viz.strategy_sweep([256, 1024, 4096, 16384])
    return _svg_of(getattr(fig, "figure", fig))


def _object(which):
    def make():
        np, sl = _sl()
        mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
        obj = {"mesh": lambda: mesh, "hardware": lambda: sl.hardware.get("h100"),
               "collective_cost": lambda: sl.cost.collective_time("psum", 2**30, axes="x", mesh=mesh),
               "plan": lambda: sl.plan_einsum("ij,jk->ik", ((1024, 1024), sl.P("x")),
                                              ((1024, 1024), sl.P(None, "y")), mesh=mesh),
               "roofline": lambda: _ledger().roofline(), "ledger": _ledger}[which]()
        return obj._repr_html_()
    return make


# name -> () -> HTML
PICTURES = {
    "sharding-2d": _view(_sharding_2d),
    "sharding-3d": _view(_sharding_3d),
    "concepts-specs": _specs,
    "concepts-storage": _view(_storage),
    "collective-all_gather": _view(_collective("all_gather")),
    "collective-psum": _view(_collective("psum")),
    "collective-psum_scatter": _view(_collective("psum_scatter")),
    "collective-all_to_all": _view(_collective("all_to_all")),
    "collective-ppermute": _view(_collective("ppermute")),
    "collective-64": _view(_collective("psum", (8, 8), ("x", "y"), ("x", "y"))),
    "links-ring": _view(_ring),
    "links-2d": _view(_links("all_gather", (4, 4), ("x", "y"), "tpu-v5e")),
    "links-3d": _view(_links("psum", (4, 4, 4), ("x", "y", "z"), "tpu-v5p")),
    "ledger": lambda: _sl()[1].viz.ledger_view(_ledger())._repr_html_(),
    "timeline": lambda: _sl()[1].viz.timeline(_ledger())._repr_html_(),
    "timeline-training": lambda: _sl()[1].viz.timeline(_training_step().ledger)._repr_html_(),
    "strategies": _view(_strategies),
    "pipeline-1f1b": _pipeline("1f1b"),
    "pipeline-interleaved": _pipeline("interleaved"),
    "pipeline-zero_bubble": _pipeline("zero_bubble"),
    "roofline-plot": _roofline_plot,
    "collective-sweep": _sweep,
    "strategy-sweep": _strategy,
    "object-mesh": _object("mesh"),
    "object-hardware": _object("hardware"),
    "object-collective_cost": _object("collective_cost"),
    "object-plan": _object("plan"),
    "object-roofline": _object("roofline"),
}


def render(name: str) -> str:
    if name not in PICTURES:
        raise KeyError(f"[docs] no picture {name!r}; known: {', '.join(PICTURES)}")
    # one line: Markdown keeps a raw HTML block whole only while it has no blank line
    html = PICTURES[name]()
    return '<div class="sl-picture" data-picture="' + name + '">' + re.sub(r"\n\s*\n", "\n", html) + "</div>"


def on_page_markdown(markdown, page, config, files, **kwargs):
    if "<!-- picture:" not in markdown:
        return markdown
    return _MARK.sub(lambda m: render(m.group(1)), markdown)
