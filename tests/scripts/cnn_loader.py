"""An MNIST-style CNN fed by a DataLoader with worker processes (random images stand in)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc1 = nn.Linear(16 * 12 * 12, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images = torch.randn(384, 1, 28, 28)
    labels = torch.randint(0, 10, (384,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True, num_workers=2)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model.train()
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()
    with torch.no_grad():
        total = sum(p.double().sum().item() for p in model.parameters())
    print(f"param-checksum {total:.17g}")


if __name__ == "__main__":
    main()
