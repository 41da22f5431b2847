"""A tiny mmengine Runner (linear model, 8 random samples) for checkpoint tests."""
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset


class ToyModel(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, y, mode='tensor'):
        out = self.fc(x).squeeze(-1)
        if mode == 'loss':
            return dict(loss=((out - y) ** 2).mean())
        return out


class ToyData(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        gen = torch.Generator().manual_seed(index)
        return dict(x=torch.randn(4, generator=gen), y=torch.randn((), generator=gen))


def make_runner(work_dir: str, max_epochs: int = 2, **kwargs) -> Runner:
    return Runner(
        model=ToyModel(), work_dir=work_dir,
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=4, collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        param_scheduler=dict(type='MultiStepLR', milestones=[1]),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0, deterministic=True), **kwargs)
