"""The "automatic mixed precision" recipe as the PyTorch tutorial writes it, with argparse and a
DataLoader: autocast around forward and loss, a GradScaler around backward and step."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 128), torch.randn(512, 16))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 16)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp)
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    print(f"final-loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
