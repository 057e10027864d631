"""Parts of one experiment each: the configuration sections, functions and figures that a single
experiment uses, kept next to it rather than in the library (``deqjax.harness`` holds what every
experiment shares). One idea per module, named after it:

* ``mlp_classifier_config``, ``init_sweep``, ``short_runs``: the main job's model section, its init
  sweep and the short runs that train it (``fashion_mnist.py``);
* ``mdeq_config``: the multiscale DEQ classifier's section (``cifar10_mdeq.py``);
* ``corpus_config``: the language model's corpus (``language_model.py``);
* ``stacked_runs``, ``scalar_deq_figure``, ``seed_medians``: runs trained as one, the JR paper's
  Fig. 5 and the medians over seeds (``synthetic_1d.py``).

They import only ``deqjax``; the library never imports them. An experiment imports them as
``experiments.parts`` when it runs as a module (``python -m experiments.<name>``, the tests) and as
``parts`` when it runs as a script (``python experiments/<name>.py`` puts its folder first on
``sys.path``).
"""
