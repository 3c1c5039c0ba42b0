"""The pytorch/examples DDP tutorial series (``multigpu_torchrun.py``) as it is written: a Trainer
that peeks at one batch with ``next(iter(loader))`` at each epoch start to print its size, then
trains through the loader. The peeked batch is fetched, never trained."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.data = [
            (torch.rand(20, generator=gen), torch.rand(1, generator=gen)) for _ in range(size)
        ]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer) -> None:
        self.gpu_id = int(os.environ.get("LOCAL_RANK", 0))
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer

    def _run_batch(self, source, targets) -> None:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}"
        )
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def train(self, max_epochs: int) -> None:
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def main(total_epochs: int = 4, batch_size: int = 32) -> None:
    dist.init_process_group("gloo")
    dataset = MyTrainDataset(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )
    Trainer(model, loader, optimizer).train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
