"""The built-in jobs' data: what `data.name` reads, as in-memory datasets both trainers shard.

- datasets: the datasets (MNIST, CIFAR-10, an image folder, synthetic, linear regression);
- mnist: MNIST's IDX files (the bundled subset in bundled/mnist/, or a full copy);
- imagefolder: class folders of images, decoded once into memory;
- CIFAR-10's reader is `paddle_dist.cifar` (numpy only, with a command of its own).

Example:
    from paddle_dist.data import datasets
    train = datasets.mnist_dataset("", "train")
"""
