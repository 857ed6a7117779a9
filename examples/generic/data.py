# data.py (seed 000's)

import torch


class OnesDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 2048

    def __getitem__(self, index):
        # return data, labels
        return torch.Tensor([1.0]), torch.Tensor([1.0])


def build_datasets(batch_size):
    train_data = torch.utils.data.DataLoader(
        OnesDataset(), batch_size=batch_size
    )
    eval_data = torch.utils.data.DataLoader(
        OnesDataset(), batch_size=batch_size
    )
    return train_data, eval_data
