# model.py (seed 000's, its typos fixed: nn imported, opt.zero_grad())

import torch
from torch import nn


def build_model(learning_rate):
    # the model is silly, the real focus is on the Generic API
    model = nn.Linear(1, 1, False)

    loss_fn = torch.nn.MSELoss()

    opt = torch.optim.SGD(model.parameters(), lr=learning_rate)

    return model, loss_fn, opt


def train_model(model, loss_fn, opt, train_data):
    losses = []
    for batch in train_data:
        data, labels = batch
        # forward pass
        pred = model(data)
        loss = loss_fn(pred, labels)
        losses.append(loss)
        # backward pass
        loss.backward()
        opt.step()
        opt.zero_grad()
    # reduce training metrics, simple average
    train_loss = sum(losses) / len(losses)
    return train_loss


@torch.no_grad
def eval_model(model, loss_fn, eval_data):
    # Validate model.
    losses = []
    for batch in eval_data:
        data, labels = batch
        pred = model(data)
        loss = loss_fn(pred, labels)
        losses.append(loss)
    val_loss = sum(losses) / len(losses)
    return val_loss
