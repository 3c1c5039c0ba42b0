"""The DataParallel tutorial style: one process, ``nn.DataParallel`` when several GPUs exist."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomDataset(Dataset):
    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)  # no seed: each process draws its own

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class Model(nn.Module):
    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
loader = DataLoader(RandomDataset(5, 400), batch_size=30, shuffle=True)
model = Model(5, 2)
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i, x in enumerate(loader):
    x = x.to(device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if i == 0:
        print(f"first-batch-checksum {x.double().sum().item():.17g}")
with torch.no_grad():
    total = sum(p.double().sum().item() for p in model.parameters())
print(f"param-checksum {total:.17g}")
