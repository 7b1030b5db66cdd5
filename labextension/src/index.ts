// dsportal's JupyterLab extension (built by JupyterLab's own builder: `jlpm build`, run by
// scripts/build-labextension.sh from `make deps`):
// - the Jobs panel, docked in the main area (jobs.ts), from the launcher and the command palette;
// - the session's slice in the status bar (slice.ts);
// - "Open TensorBoard" on folders in the file browser, "TensorBoard (this folder)" in the launcher;
// - opening a file under templates/ opens the user's own copy instead (made on first open, never
//   overwritten), with a note when the template changed since, and an offer of a fresh copy;
// - a warning before the hub stops a session nobody uses (idle limit), with "Keep my session";
// - the slice's gauges (gauges.ts): use against its limits in the status bar, a panel with the
//   details, a warning before the memory limit, and a message when that limit killed a kernel.
import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { DocumentWidget } from '@jupyterlab/docregistry';
import { ILauncher } from '@jupyterlab/launcher';
import { IEditorServices } from '@jupyterlab/codeeditor';
import { INotebookWidgetFactory, NotebookPanel, NotebookWidgetFactory } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { api, duration, sessionUrl, state } from './api';
import { JobFilesDrive } from './jobfiles';
import { JobsPanel } from './jobs';
import { Slice, SLICE_CHANGED, SliceStatus } from './slice';
import { OUT_OF_MEMORY, UsagePanel, UsageStatus, UsageWatch } from './gauges';
import { GuestBanner, SharingPanel, whoIsHere } from './sharing';

import '../style/index.css';

const JOB_NOTEBOOK_FACTORY = 'dsportal-job-notebook';

const jobsIcon = new LabIcon({
  name: 'dsportal:jobs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<rect x="2" y="3" width="8" height="7" rx="1"/><rect x="14" y="3" width="8" height="7" rx="1"/>' +
    '<rect x="2" y="14" width="8" height="7" rx="1"/><rect x="14" y="14" width="8" height="7" rx="1"/>' +
    '<path d="M10 6h4v1h-4zM10 17h4v1h-4zM5.5 10h1v4h-1zM17.5 10h1v4h-1z"/></g></svg>'
});

const tensorboardIcon = new LabIcon({
  name: 'dsportal:tensorboard',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 20h18v1.5H3z"/><path d="M4 17l5-6 4 3 6-8 1.2.9-7 9.4-4-3-4 4.8z"/></g></svg>'
});

const COMMANDS = {
  jobs: 'dsportal:open-jobs',
  runNotebook: 'dsportal:run-notebook-as-job',
  tensorboard: 'dsportal:open-tensorboard',
  tensorboardHere: 'dsportal:open-tensorboard-here',
  freshCopy: 'dsportal:fresh-template-copy',
  keep: 'dsportal:keep-session',
  extend: 'dsportal:extend-session',
  usage: 'dsportal:open-usage',
  share: 'dsportal:share-session'
};

type Notify = (message: string, type?: string, actions?: { label: string; commandId: string; args?: any; displayType?: string }[]) => Promise<string>;

function notifier(app: JupyterFrontEnd): Notify {
  return (message, type = 'info', actions = []) =>
    app.commands
      .execute('apputils:notify', { message, type, options: { autoClose: actions.length ? false : 8000, actions } })
      .then(id => String(id))
      .catch(() => {
        console.info('dsportal:', message);
        return '';
      });
}

function fileBrowser(app: JupyterFrontEnd): any {
  for (const widget of app.shell.widgets('left')) {
    if (widget.id === 'filebrowser') {
      return widget;
    }
  }
  return null;
}

function openTensorBoard(folder: string): void {
  window.open(`${sessionUrl('dsportal/tensorboard-open')}?logdir=${encodeURIComponent(folder || '.')}`, '_blank');
}

// ------------------------------------------------------------------------------------ templates
interface Opened {
  path: string;
  created: boolean;
  template_updated: boolean;
  own_template: boolean;
}

async function openTemplateCopy(app: JupyterFrontEnd, notify: Notify, template: string, fresh: boolean, widget: Widget | null): Promise<void> {
  let answer: Opened;
  try {
    answer = await api<Opened>('POST', 'templates/open', { path: template, fresh });
  } catch (error) {
    notify(`Could not make your copy of ${template}: ${(error as Error).message}`, 'error');
    return;
  }
  if (answer.own_template) {
    notify(`You own ${template}: what you save here is what every user sees.`, 'warning');
    return;
  }
  if (widget && !widget.isDisposed) {
    // Never edited (it is read-only), so no "save your changes?" question: a kernel that started
    // meanwhile may have touched the notebook's metadata, which would make close() ask one.
    (widget as DocumentWidget).context?.sessionContext?.shutdown().catch(() => undefined);
    widget.dispose();
  }
  await app.commands.execute('docmanager:open', { path: answer.path });
  const message = answer.created
    ? `This is your own copy, ${answer.path}: edit and run it freely. The template stays as it is.`
    : `Opened your copy ${answer.path} (made earlier, kept as you left it).`;
  if (answer.template_updated) {
    notify(`${message} The template has changed since you copied it.`, 'info', [
      { label: 'Open a fresh copy', commandId: COMMANDS.freshCopy, args: { path: template } }
    ]);
  } else {
    notify(message, 'info');
  }
}

async function watchTemplates(app: JupyterFrontEnd, notify: Notify): Promise<void> {
  let info: { folder: string };
  try {
    info = await api<{ folder: string }>('GET', 'templates');
  } catch {
    return; // a session without templates
  }
  const prefix = `${info.folder}/`;
  const seen = new WeakSet<Widget>();
  state.templatesFolder = info.folder;
  const check = () => {
    for (const widget of app.shell.widgets('main')) {
      const path = (widget as DocumentWidget).context?.path;
      if (!path || !path.startsWith(prefix) || path === `${prefix}README.md` || seen.has(widget)) {
        continue;
      }
      seen.add(widget);
      void openTemplateCopy(app, notify, path, false, widget);
    }
  };
  (app.shell as ILabShell).layoutModified?.connect(check);
  app.shell.currentChanged?.connect(check);
  check();
}

// ------------------------------------------------------------------------------------ idle sessions
interface Idle {
  limit_s: number | null;
  idle_s: number;
  stop_in_s: number;
}

function watchIdle(app: JupyterFrontEnd, notify: Notify): void {
  // The hub stops a session nobody uses for its partition's idle limit (GPUs go back to the
  // queue): say so before it happens, with a button that counts as use. Reading this API does
  // not count as use, so an open tab does not keep the session alive by itself.
  let shown: Promise<string> | null = null;
  const dismiss = () => {
    shown?.then(id => id && app.commands.execute('apputils:dismiss-notification', { id }));
    shown = null;
  };
  const look = async () => {
    let idle: Idle;
    try {
      idle = await api<Idle>('GET', 'idle');
    } catch {
      window.setTimeout(look, 60_000);
      return;
    }
    if (!idle.limit_s) {
      return;
    }
    const warnFrom = Math.min(600, Math.floor(idle.limit_s / 2));
    if (idle.stop_in_s <= warnFrom && shown === null) {
      shown = notify(
        `This session has not been used for ${duration(idle.idle_s)}: it will be stopped in about ${duration(idle.stop_in_s)} ` +
          `so its resources go back to others (limit ${duration(idle.limit_s)}). Running code, even silently, counts as use.`,
        'warning',
        [{ label: 'Keep my session', commandId: COMMANDS.keep, displayType: 'accent' }]
      );
    } else if (idle.stop_in_s > warnFrom && shown !== null) {
      dismiss();
    }
    state.idle = idle;
    window.setTimeout(look, 1000 * Math.max(5, Math.min(60, Math.floor(idle.limit_s / 4))));
  };
  app.commands.addCommand(COMMANDS.keep, {
    label: 'Keep my session',
    execute: async () => {
      await api('POST', 'idle');
      dismiss();
      notify('Your session is kept: the idle clock starts again.', 'info');
    }
  });
  void look();
}

// ------------------------------------------------------------------------------------ walltime
const WARN_AT_S = [15 * 60, 5 * 60]; // before the walltime ends: warn with Save all and Extend
const EXTEND_MINUTES = 60;

function watchWalltime(app: JupyterFrontEnd, notify: Notify): void {
  const warned = new Set<number>();
  const look = async () => {
    let slice: Slice;
    try {
      slice = await api<Slice>('GET', 'slice');
    } catch {
      window.setTimeout(look, 60_000);
      return;
    }
    const left = slice.time_left_s;
    if (left === null) {
      return;
    }
    for (const at of WARN_AT_S) {
      if (left > at) {
        warned.delete(at); // extended since: warn again when it comes round
      } else if (!warned.has(at) && left > 0) {
        warned.add(at);
        void notify(
          `Your session's walltime ends in ${duration(left)}: then Slurm stops it, with its kernels. ` +
            'Save your work, or extend the session.',
          'warning',
          [
            { label: 'Save all', commandId: 'docmanager:save-all', displayType: 'accent' },
            { label: `Extend by ${EXTEND_MINUTES} min`, commandId: COMMANDS.extend }
          ]
        );
      }
    }
    // Closer to the end, closer looks.
    window.setTimeout(look, left <= WARN_AT_S[0] + 120 ? 15_000 : 60_000);
  };
  app.commands.addCommand(COMMANDS.extend, {
    label: `Extend my session by ${EXTEND_MINUTES} min`,
    execute: async () => {
      try {
        const done = await api<{ message: string }>('POST', 'extend', { minutes: EXTEND_MINUTES });
        void notify(done.message, 'success');
      } catch (error) {
        void notify((error as Error).message, 'error');
      }
      window.dispatchEvent(new Event(SLICE_CHANGED));
    }
  });
  void look();
}

// When Slurm tells the session its walltime ends, or that it preempts the job
// (portal/session/usage/walltime.py): save every open document with unsaved changes, say which to the server (it writes them to the session's log,
// which the hub quotes on the next page), and tell the user.
const WALLTIME_ENDING = 'https://dsportal.invalid/events/walltime-ending/v1';

function saveBeforeTheEnd(app: JupyterFrontEnd, notify: Notify): void {
  const events = app.serviceManager.events;
  events.stream.connect(async (_sender: unknown, event: { schema_id: string; [key: string]: any }) => {
    if (event.schema_id !== WALLTIME_ENDING) {
      return;
    }
    const saved: string[] = [];
    for (const widget of app.shell.widgets('main')) {
      const context = (widget as any).context;
      if (context?.model?.dirty && !context.model.readOnly) {
        try {
          await context.save();
          saved.push(context.path);
        } catch (error) {
          console.error('dsportal: could not save', context.path, error);
        }
      }
    }
    await api('POST', 'walltime/saved', { saved }).catch(() => undefined);
    const left = duration(Number(event.seconds_left) || 0);
    const what = saved.length ? `saved ${saved.join(', ')}` : 'every document was saved already';
    const preempted = String(event.reason || '').startsWith('preempted');
    void notify(
      preempted // short: a toast shows 140 characters (the notification center, all)
        ? `Preempted: Slurm stops this session in about ${left} for higher-priority work; ${what}. ` +
            (event.reason === 'preempted-requeue' ? 'It comes back by itself later.' : 'Start it again afterwards.')
        : `Your session's walltime ends in about ${left}: ${what}. Its kernels are being shut down; ` +
            'start a new session to go on.',
      'warning'
    );
  });
}

// ------------------------------------------------------------------------------------ plugins
const main: JupyterFrontEndPlugin<void> = {
  id: 'dsportal-lab:plugin',
  description: 'dsportal: the Jobs panel, TensorBoard on folders, template copies, idle warnings',
  autoStart: true,
  optional: [ILauncher, ICommandPalette, ILayoutRestorer, INotebookWidgetFactory, NotebookPanel.IContentFactory,
    IRenderMimeRegistry, IEditorServices],
  activate: (
    app: JupyterFrontEnd,
    launcher: ILauncher | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    notebooks: NotebookWidgetFactory.IFactory | null,
    contentFactory: NotebookPanel.IContentFactory | null,
    rendermime: IRenderMimeRegistry | null,
    editors: IEditorServices | null
  ) => {
    if (whoIsHere().guest) {
      return;  // the Jobs panel, TensorBoards, templates and idle warnings are the owner's (sharing.ts)
    }
    const notify = notifier(app);
    const tracker = new WidgetTracker<JobsPanel>({ namespace: 'dsportal-jobs' });
    app.serviceManager.contents.addDrive(new JobFilesDrive());
    // A job's notebooks open as the job left them, with no kernel: JupyterLab's notebook view, told by
    // its public options neither to start one nor to offer it (each kernel would take the slice's memory).
    let factory: string | undefined;
    if (notebooks && contentFactory && rendermime && editors) {
      factory = JOB_NOTEBOOK_FACTORY;
      app.docRegistry.addWidgetFactory(
        new NotebookWidgetFactory({
          name: factory,
          label: 'Notebook, as the job left it',
          fileTypes: ['notebook'],
          modelName: 'notebook',
          preferKernel: false,
          canStartKernel: false,
          rendermime,
          contentFactory,
          mimeTypeService: editors.mimeTypeService,
          editorConfig: notebooks.editorConfig,
          notebookConfig: notebooks.notebookConfig
        })
      );
    }

    app.commands.addCommand(COMMANDS.jobs, {
      label: 'Multi-node jobs',
      caption: 'Launch, follow and cancel multi-node jobs (Horovod/MPI, torchrun)',
      icon: jobsIcon,
      execute: async () => {
        let panel = tracker.currentWidget;
        if (!panel || panel.isDisposed) {
          panel = new JobsPanel((path, mode) =>
            app.commands.execute('docmanager:open', { path, factory, ...(mode ? { options: { mode } } : {}) })
          );
          panel.title.icon = jobsIcon;
          await tracker.add(panel);
          app.shell.add(panel, 'main');
        }
        app.shell.activateById(panel.id);
        return panel;
      }
    });
    app.commands.addCommand(COMMANDS.runNotebook, {
      label: 'Run as job…',
      caption: 'Run this notebook headless in a Slurm job of its own: once, or once per point of a grid of parameters',
      icon: jobsIcon,
      execute: async () => {
        const item = fileBrowser(app)?.selectedItems?.().next();
        if (!item || item.done || item.value?.type !== 'notebook') {
          return;
        }
        const panel = (await app.commands.execute(COMMANDS.jobs)) as JobsPanel;
        panel.runNotebook(item.value.path);
      }
    });
    app.commands.addCommand(COMMANDS.tensorboard, {
      label: 'Open TensorBoard',
      caption: "TensorBoard for this folder's logs, in a new tab",
      icon: tensorboardIcon,
      execute: () => {
        const browser = fileBrowser(app);
        let folder: string = browser?.model?.path ?? '';
        const item = browser?.selectedItems?.().next();
        if (item && !item.done && item.value?.type === 'directory') {
          folder = item.value.path;
        }
        openTensorBoard(folder);
      }
    });
    app.commands.addCommand(COMMANDS.tensorboardHere, {
      label: 'TensorBoard (this folder)',
      caption: "TensorBoard for the file browser's current folder",
      icon: tensorboardIcon,
      execute: () => openTensorBoard(fileBrowser(app)?.model?.path ?? '')
    });
    app.commands.addCommand(COMMANDS.freshCopy, {
      label: 'Open a fresh copy',
      caption: "Copy the template's current version beside your earlier copy",
      execute: args => openTemplateCopy(app, notify, String(args.path), true, null)
    });

    app.contextMenu.addItem({ command: COMMANDS.tensorboard, selector: '.jp-DirListing-item[data-isdir="true"]', rank: 3 });
    app.contextMenu.addItem({ command: COMMANDS.runNotebook, selector: '.jp-DirListing-item[data-file-type="notebook"]', rank: 3 });
    app.contextMenu.addItem({ command: COMMANDS.tensorboardHere, selector: '.jp-DirListing-content', rank: 100 });
    if (launcher) {
      launcher.add({ command: COMMANDS.jobs, category: 'Other', rank: 1 });
      launcher.add({ command: COMMANDS.tensorboardHere, category: 'Other', rank: 2 });
    }
    if (palette) {
      for (const command of [COMMANDS.jobs, COMMANDS.tensorboardHere]) {
        palette.addItem({ command, category: 'dsportal' });
      }
    }
    if (restorer) {
      void restorer.restore(tracker, { command: COMMANDS.jobs, name: () => 'jobs' });
    }
    state.loaded = true;
    void app.restored.then(() => {
      watchIdle(app, notify);
      watchWalltime(app, notify);
      saveBeforeTheEnd(app, notify);
      return watchTemplates(app, notify);
    });
  }
};

const slice: JupyterFrontEndPlugin<void> = {
  id: 'dsportal-lab:slice',
  description: "The session's Slurm slice and walltime left, in the status bar",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    if (!statusBar || whoIsHere().guest) {
      return;
    }
    const item = new SliceStatus(() => void app.commands.execute(COMMANDS.extend));
    statusBar.registerStatusItem('dsportal-lab:slice', { item, align: 'left', rank: 50 });
  }
};

const gauges: JupyterFrontEndPlugin<void> = {
  id: 'dsportal-lab:gauges',
  description: "The session's use against its slice's limits: status bar, panel, memory warning, kernels the limit killed",
  autoStart: true,
  optional: [IStatusBar, ICommandPalette],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null, palette: ICommandPalette | null) => {
    if (whoIsHere().guest) {
      return;
    }
    const notify = notifier(app);
    // With a button, a notification stays until dismissed: these must not pass unseen.
    const watch = new UsageWatch((message, type) => notify(message, type, [{ label: 'Show my slice', commandId: COMMANDS.usage }]));
    let panel: UsagePanel | null = null;
    app.commands.addCommand(COMMANDS.usage, {
      label: 'My slice: memory, CPU and GPUs in use',
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new UsagePanel(watch);
          app.shell.add(panel, 'right', { rank: 900 });
        }
        app.shell.activateById(panel.id);
      }
    });
    palette?.addItem({ command: COMMANDS.usage, category: 'dsportal' });
    // The server says at once when the memory limit killed a kernel (portal/session/usage/gauges.py).
    app.serviceManager.events.stream.connect((_sender: unknown, event: { schema_id: string; [key: string]: any }) => {
      if (event.schema_id === OUT_OF_MEMORY) {
        watch.outOfMemory(String(event.kernel_id), null, String(event.message));
      }
    });
    if (statusBar) {
      const item = new UsageStatus(watch, () => void app.commands.execute(COMMANDS.usage));
      statusBar.registerStatusItem('dsportal-lab:gauges', { item, align: 'left', rank: 60 });
    }
  }
};

const sharing: JupyterFrontEndPlugin<void> = {
  id: 'dsportal-lab:sharing',
  description: "Share this session with a colleague (the owner's Share panel); a guest's word on whose session this is",
  autoStart: true,
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null) => {
    const here = whoIsHere();
    if (here.guest) {
      app.shell.add(new GuestBanner(here.owner, here.me), 'top', { rank: 1000 });
      return;
    }
    let panel: SharingPanel | null = null;
    app.commands.addCommand(COMMANDS.share, {
      label: 'Share this session…',
      caption: 'Let a colleague work in this session with you, until you take it back',
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new SharingPanel();
          app.shell.add(panel, 'right', { rank: 950 });
        }
        app.shell.activateById(panel.id);
      }
    });
    void api<{ shareable: boolean }>('GET', 'sharing?brief=1').then(answer => {
      state.shareable = answer.shareable;
      if (!answer.shareable) {
        return;
      }
      palette?.addItem({ command: COMMANDS.share, category: 'dsportal' });
      const button = new Widget({ node: document.createElement('button') });
      button.id = 'dsportal-share-button';
      button.addClass('jp-Button');
      button.addClass('jp-mod-styled');
      button.addClass('dsportal-ShareButton');
      button.node.textContent = 'Share';
      button.node.title = 'Share this session with a colleague';
      button.node.onclick = () => void app.commands.execute(COMMANDS.share);
      app.shell.add(button, 'top', { rank: 1000 });
    }, () => undefined);
  }
};

export default [main, slice, gauges, sharing];
