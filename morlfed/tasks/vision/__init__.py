"""The supervised-vision path (``task=vision``): the same strategies on label-skewed image classification.

See ``docs/vision.md``.

* :mod:`morlfed.tasks.vision.data` -- datasets: scikit-learn's digits, torchvision's MNIST,
  Fashion-MNIST, CIFAR-10/100 from a local folder;
* :mod:`morlfed.tasks.vision.partition` -- Dirichlet, pathological and IID partitions with per-client
  train/test splits;
* :mod:`morlfed.tasks.vision.models` -- the MLP and the FedAvg 4-layer CNN, each a body and a head;
* :mod:`morlfed.tasks.vision.client` -- the vision client (local SGD epochs);
* :mod:`morlfed.tasks.vision.task` -- the task: the experiment from the config, its inputs and report;
* :mod:`morlfed.tasks.vision.experiment` -- a validated experiment from the configuration;
* :mod:`morlfed.tasks.vision.report` -- the label histogram, ``final.csv`` and ``metrics.json``.
"""

#: this folder's layer (docs/architecture.md): it imports from its own folder and from lower layers only
LAYER = 5
