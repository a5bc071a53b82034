"""A Horovod PyTorch script run through pushpull with one line changed: the structure of
Horovod's ``examples/pytorch/pytorch_mnist.py`` (a small CNN, ``DistributedSampler`` shards,
the learning rate scaled by ``hvd.size()``, ``broadcast_parameters`` and
``broadcast_optimizer_state`` from rank 0, ``DistributedOptimizer`` with ``compression``,
``op`` and ``gradient_predivide_factor``, test metrics averaged with ``hvd.allreduce``) on
scikit-learn's digits (8x8 images shipped with scikit-learn: no download) in place of MNIST.
The import is the one change a Horovod user makes::

    pushpull local --workers 2 -- python python/examples/horovod_digits.py --fp16-allreduce

``--synchronize-first`` takes the path of Horovod's mixed-precision loop on the CPU
(``optimizer.synchronize()``, then ``step()`` under ``optimizer.skip_synchronize()``), and
``--use-adasum`` asks for ``op=hvd.Adasum``, which pushpull refuses naming what it supports.
Rank 0 prints the test loss and accuracy after each epoch.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pushpull.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--test-batch-size", type=int, default=200)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=40)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--synchronize-first", action="store_true", default=False)


class Net(nn.Module):
    """pytorch_mnist.py's network, its kernels sized for 8x8 images (and without its dropout
    of whole channels, which a 2x2 map of 20 channels does not survive)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=3)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=2)
        self.fc1 = nn.Linear(80, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.conv2(x))
        x = x.view(-1, 80)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def datasets():
    """The digits as (image, label) datasets, a fixed train/test split, the pixels normalised
    as pytorch_mnist.py normalises MNIST's (to mean 0 and deviation 1 over the set)."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(y)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0)
    return (torch.utils.data.TensorDataset(xtr, ytr),
            torch.utils.data.TensorDataset(xte, yte))


def train(args):
    def train_epoch(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            if args.synchronize_first:
                # Horovod's mixed-precision loop: the gradients are averaged before the step
                # (where a loss scaler would unscale them), and the step does not wait again.
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                      f"\tLoss: {loss.item():.6f}")

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test():
        model.eval()
        test_loss = 0.0
        test_accuracy = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.max(1, keepdim=True)[1]
                test_accuracy += pred.eq(target.view_as(pred)).float().sum().item()
        # Horovod: use test_sampler to determine the number of examples in this worker's
        # partition, and average the metrics across workers.
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(f"\nTest set: Average loss: {test_loss:.4f}, "
                  f"Accuracy: {100.0 * test_accuracy:.2f}%\n", flush=True)
        return test_accuracy

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)
    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset, test_dataset = datasets()
    # Horovod: use DistributedSampler to partition the training and test data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        accuracy = test()
    return accuracy


if __name__ == "__main__":
    train(parser.parse_args())
